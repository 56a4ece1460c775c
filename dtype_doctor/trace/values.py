"""Value statistics measured during the trace, where the tensors live, read back once.

Each observed tensor gets one small float64 vector computed by a handful of kernels on its
own device — no host synchronisation per tensor. `resolve()` stacks the vectors per device
and reads them back in one transfer each (one synchronisation on CUDA for the whole trace).

Exact over the whole tensor: the largest magnitude (one `aminmax` pass, which also shows
any inf or nan). From at most `SAMPLE` evenly spaced elements (gathered with `take`, so a
non-contiguous tensor is never copied whole): the share of non-finite values, the share of
non-zero values below float16's smallest normal (with and without GradScaler's scale) and
the smallest non-zero magnitude. A full pass for each would cost more than the forward on
a 2-core CPU; 4,096 samples put a share within about ±1.5 % (95 %).
"""

from __future__ import annotations

import math

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dtype_doctor.records import FP16_TINY, GRAD_SCALE, ValueStats, merge_stats

SAMPLE = 4096
_FIELDS = 8  # min, max, min_nonzero, nonfinite, below, below_scaled, nonzero, sampled


class ValueProbe:
    """Handles for tensors' statistics now, ValueStats after `resolve()`."""

    def __init__(self) -> None:
        self._pending: list[torch.Tensor] = []
        self._numel: list[int] = []
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._index: dict[tuple[int, str], torch.Tensor] = {}
        self._resolved: list[ValueStats] | None = None

    def observe(self, t: object, *, as_last_seen: bool = False) -> int | None:
        """A handle for `t`'s statistics; None for what holds no floating values.

        A tensor written in place since it was measured (its version counter, which views
        share, moved on) is measured anew — unless `as_last_seen`, for an in-place op's
        operands, whose values before the op are the ones that matter.
        """
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return None
        if _holds_no_data(t):
            return None
        seen = self._seen.get(t)
        version = t._version
        if seen is not None and (as_last_seen or seen[1] == version):
            return seen[0]
        with torch.no_grad():
            vector = self._measure(t.detach())
        self._pending.append(vector)
        self._numel.append(t.numel())
        handle = len(self._pending) - 1
        self._seen[t] = (handle, version)
        return handle

    def _measure(self, x: torch.Tensor) -> torch.Tensor:
        n = x.numel()
        lo, hi = torch.aminmax(x.reshape(-1) if x.is_contiguous() else x)
        if n > SAMPLE:
            key = (n, str(x.device))
            idx = self._index.get(key)
            if idx is None:
                idx = torch.linspace(0, n - 1, SAMPLE, device=x.device).long()
                self._index[key] = idx
            s = torch.take(x, idx)
        else:
            s = x.reshape(-1)
        s = s.double()
        a = s.abs()
        nonzero = a > 0
        return torch.stack(
            [
                lo.double(),
                hi.double(),
                torch.where(nonzero, a, math.inf).amin(),
                (~torch.isfinite(s)).sum().double(),
                (nonzero & (a < FP16_TINY)).sum().double(),
                (nonzero & (a * GRAD_SCALE < FP16_TINY)).sum().double(),
                nonzero.sum().double(),
                torch.tensor(float(s.numel()), dtype=torch.float64, device=s.device),
            ]
        )

    def resolve(self) -> list[ValueStats]:
        """Every handle's ValueStats, read back in one transfer per device."""
        if self._resolved is not None:
            return self._resolved
        rows: list[list[float]] = [[] for _ in self._pending]
        by_device: dict[str, list[int]] = {}
        for i, v in enumerate(self._pending):
            by_device.setdefault(str(v.device), []).append(i)
        for indices in by_device.values():
            values = torch.stack([self._pending[i] for i in indices]).tolist()
            for i, row in zip(indices, values):
                rows[i] = row
        self._resolved = [_stats(row, n) for row, n in zip(rows, self._numel)]
        self._pending.clear()
        return self._resolved

    def get(self, handle: int | None) -> ValueStats | None:
        return None if handle is None else self.resolve()[handle]

    def merged(self, handles: list[int | None]) -> ValueStats | None:
        return merge_stats([s for h in handles if (s := self.get(h)) is not None])


def _stats(row: list[float], numel: int) -> ValueStats:
    lo, hi, min_nz, nonfinite, below, below_scaled, nonzero, sampled = row
    absmax = max(abs(lo), abs(hi)) if not (math.isnan(lo) or math.isnan(hi)) else math.nan
    return ValueStats(
        absmax=absmax,
        nonfinite_any=not (math.isfinite(lo) and math.isfinite(hi)),
        min_nonzero=min_nz if math.isfinite(min_nz) else None,
        nonfinite=nonfinite / sampled if sampled else 0.0,
        below_fp16_normal=below / nonzero if nonzero else 0.0,
        below_fp16_normal_scaled=below_scaled / nonzero if nonzero else 0.0,
        sampled=int(sampled),
        numel=numel,
    )


def _holds_no_data(t: torch.Tensor) -> bool:
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
