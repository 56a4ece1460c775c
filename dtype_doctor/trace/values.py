"""Value statistics measured during the trace, where the tensors live, read back once.

Each observed tensor costs three kernels on its own device and no host synchronisation:
`resolve()` computes every tensor's statistics in one batch per device and reads them back
in one transfer each (one synchronisation on CUDA for the whole trace).

Exact over the whole tensor: the largest magnitude (one `aminmax` pass, which also shows
any inf or nan). From at most `SAMPLE` evenly spaced elements (every step-th element of the
flattened tensor): the share of non-finite values, the share of non-zero
values below float16's smallest normal (with and without GradScaler's scale) and the
smallest non-zero magnitude. A full pass for each would cost more than the forward on a
2-core CPU; 4,096 samples put a share within about ±1.5 % (95 %). A view is measured as its
base, whose values bound it.
"""

from __future__ import annotations

import math

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dtype_doctor.records import FP16_TINY, GRAD_SCALE, ValueStats, merge_stats

SAMPLE = 4096


class ValueProbe:
    """Handles for tensors' statistics now, ValueStats after `resolve()`.

    Per tensor only three kernels run during the trace (one `aminmax`, a strided sample and
    its copy); the shares are computed for all samples at once in `resolve()`.
    """

    def __init__(self) -> None:
        self._extremes: list[tuple[torch.Tensor, torch.Tensor]] = []  # (min, max) per handle, on the tensor's device
        self._samples: list[torch.Tensor] = []  # ≤ SAMPLE float64 values per handle
        self._numel: list[int] = []
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
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
        if t._base is not None and t._base.dtype == t.dtype:
            # A view (a transpose, a reshape, a slice) holds some of its base's values: the base's
            # statistics bound it, and measuring every view would cost more than the forward.
            t = t._base
        seen = self._seen.get(t)
        version = t._version
        if seen is not None and (as_last_seen or seen[1] == version):
            return seen[0]
        with torch.no_grad():
            x = t.detach()
            flat = x.reshape(-1)  # a view when contiguous, as nearly every op's result is
            n = flat.numel()
            self._extremes.append(torch.aminmax(flat))  # no stack here: autocast would "promote" it
            # Every step-th element: a strided view, copied as at most SAMPLE float64 values.
            sample = flat[:: -(-n // SAMPLE)] if n > SAMPLE else flat
            self._samples.append(sample.to(torch.float64, copy=True))
        self._numel.append(n)
        handle = len(self._numel) - 1
        self._seen[t] = (handle, version)
        self._resolved = None
        return handle

    def resolve(self) -> list[ValueStats]:
        """Every handle's ValueStats: computed per device in one batch, read back in one transfer."""
        if self._resolved is not None:
            return self._resolved
        rows: list[list[float]] = [[] for _ in self._numel]
        by_device: dict[str, list[int]] = {}
        for i, s in enumerate(self._samples):
            by_device.setdefault(str(s.device), []).append(i)
        for device, indices in by_device.items():
            # The user's own autocast may still be on (watch() inside an autocast block).
            with torch.autocast(torch.device(device).type, enabled=False):
                batch = _batch([self._extremes[i] for i in indices], [self._samples[i] for i in indices])
            for i, row in zip(indices, batch):
                rows[i] = row
        self._resolved = [_stats(row, n) for row, n in zip(rows, self._numel)]
        return self._resolved

    def get(self, handle: int | None) -> ValueStats | None:
        return None if handle is None else self.resolve()[handle]

    def merged(self, handles: list[int | None]) -> ValueStats | None:
        return merge_stats([s for h in handles if (s := self.get(h)) is not None])


def _batch(extremes: list[tuple[torch.Tensor, torch.Tensor]], samples: list[torch.Tensor]) -> list[list[float]]:
    """One row per tensor: min, max, min_nonzero, nonfinite, below, below_scaled, nonzero, sampled."""
    lengths = torch.tensor([len(s) for s in samples], device=samples[0].device)
    padded = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    valid = torch.arange(padded.shape[1], device=padded.device)[None, :] < lengths[:, None]
    a = padded.abs()
    nonzero = valid & (a > 0)
    table = torch.stack(
        [
            torch.where(nonzero, a, math.inf).amin(1),
            (valid & ~torch.isfinite(padded)).sum(1).double(),
            (nonzero & (a < FP16_TINY)).sum(1).double(),
            (nonzero & (a * GRAD_SCALE < FP16_TINY)).sum(1).double(),
            nonzero.sum(1).double(),
            lengths.double(),
        ],
        dim=1,
    )
    lows = torch.stack([lo.double() for lo, _ in extremes])
    highs = torch.stack([hi.double() for _, hi in extremes])
    return torch.cat([lows[:, None], highs[:, None], table], dim=1).tolist()


def _stats(row: list[float], numel: int) -> ValueStats:
    lo, hi, min_nz, nonfinite, below, below_scaled, nonzero, sampled = row  # as _batch lays them out
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
