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
import time
from typing import Any

import torch

from dtype_doctor.records import FP16_TINY, GRAD_SCALE, ValueStats, merge_stats
from dtype_doctor.trace.subclass import library_wrapper
from dtype_doctor.trace.weakid import WeakIdMap

SAMPLE = 4096
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # no subclass: no fake tensor, no meta wrapper


class ValueProbe:
    """Handles for tensors' statistics now, ValueStats after `resolve()`.

    Per tensor only three kernels run during the trace (one `aminmax`, a strided sample and
    its copy); the shares are computed for all samples at once in `resolve()`.
    """

    def __init__(self) -> None:
        # (min, max) per handle, on the tensor's device (read at once on the CPU); or the handles whose extremes bound it.
        self._extremes: list[tuple[Any, Any] | list[int]] = []
        # ≤ SAMPLE values per handle: a row of `_rows` (a CPU tensor's, in float32), or a tensor of its own
        # (float32 on another device, float64 for float64).
        self._samples: list[torch.Tensor | int] = []
        self._rows = _SampleRows()
        self._numel: list[int] = []
        self._seen: WeakIdMap[tuple[int, int]] = WeakIdMap()
        self._resolved: list[ValueStats] | None = None

    def observe(
        self, t: object, *, as_last_seen: bool = False, bounded_by: list[int] | None = None, written: bool = False
    ) -> int | None:
        """A handle for `t`'s statistics; None for what holds no floating values.

        A tensor written in place since it was measured (its version counter, which views
        share, moved on) is measured anew — unless `as_last_seen`, for an in-place op's
        operands, whose values before the op are the ones that matter. `bounded_by`: the
        handles of the operands of an op that only selects or shrinks them (relu, gelu, where,
        max pooling: |y| ≤ max |x|, finite in, finite out), whose extremes bound this tensor's;
        only its sample is taken, saving the full pass. `written`: the result of an op that just
        wrote into `t`, whose version counter moves on by one only when the op's dispatch returns:
        measured anew, and known by that next version.

        Called for every operand and result of every op: the checks come cheapest first, and a
        tensor measured before costs one lookup.
        """
        if not written:  # most calls: a result measured when its op ran, met again as an operand
            seen = self._seen.get(t)
            if seen is not None and (as_last_seen or seen[1] == t._version):  # type: ignore[union-attr]
                return seen[0]
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            return None
        if type(t) not in PLAIN_TYPES:
            if _holds_no_data(t):
                return None
            t = _local(t)
        base = t._base
        if base is not None and base.dtype == t.dtype:
            # A view (a transpose, a reshape, a slice) holds some of its base's values: the base's
            # statistics bound it, and measuring every view would cost more than the forward.
            t = base
        seen = None if written else self._seen.get(t)
        if seen is not None and (as_last_seen or seen[1] == t._version):
            return seen[0]
        if t.is_meta:
            return None
        n = t.numel()
        with torch.no_grad():
            # The elements in memory order, without a copy: contiguous, or dense in another order.
            flat = t.view(-1) if t.is_contiguous() else (t.as_strided((n,), (1,)) if _dense(t) else None)
            # No stack here: the model's autocast would "promote" it.
            whole = t if flat is None else flat
            if whole.element_size() == 1:  # float8: no aminmax kernel; its values are exact in float32
                whole = whole.float()
            on_cpu = t.device.type == "cpu"
            ends = list(bounded_by) if bounded_by else _EXTREMES.of(whole, flat is not None)
            if on_cpu and isinstance(ends, tuple):  # read now (no synchronisation on the CPU): no small tensors kept
                ends = (float(ends[0]), float(ends[1]))
            self._extremes.append(ends)
            if flat is None:
                flat = t.reshape(-1)  # an overlapping or gapped layout: the one copy
            # Every step-th element: a strided view, copied as at most SAMPLE values. float32 holds
            # every float16, bfloat16 and float32 value exactly, at half float64's cost.
            sample = flat[:: -(-n // SAMPLE)] if n > SAMPLE else flat
            if on_cpu and t.dtype != torch.float64:
                self._samples.append(self._rows.add(sample))
            else:
                self._samples.append(sample.to(torch.float64 if t.dtype == torch.float64 else torch.float32, copy=True))
        self._numel.append(n)
        handle = len(self._numel) - 1
        self._seen[t] = (handle, t._version + written)
        self._resolved = None
        return handle

    def known(self, t: object, *, as_last_seen: bool = False) -> int | None:
        """The handle `t` already has (its values unchanged since, or `as_last_seen`), else None."""
        if isinstance(t, torch.Tensor) and type(t) not in PLAIN_TYPES:
            t = _local(t)
        if isinstance(t, torch.Tensor) and t._base is not None and t._base.dtype == t.dtype:
            t = t._base
        seen = self._seen.get(t) if isinstance(t, torch.Tensor) else None
        if seen is not None and (as_last_seen or seen[1] == t._version):  # type: ignore[union-attr]
            return seen[0]
        return None

    def resolve(self) -> list[ValueStats]:
        """Every handle's ValueStats: computed per device in one batch, read back in one transfer."""
        if self._resolved is not None:
            return self._resolved
        rows: list[list[float]] = [[] for _ in self._numel]
        by_device: dict[str, list[int]] = {}
        for i, s in enumerate(self._samples):
            by_device.setdefault("rows" if isinstance(s, int) else str(s.device), []).append(i)
        if "rows" in by_device:
            table, lengths = self._rows.table(), self._rows.lengths
            for i in by_device.pop("rows"):
                row, ends = self._samples[i], self._extremes[i]
                lo, hi = ends if isinstance(ends, tuple) else (0.0, 0.0)
                rows[i] = _row(lo, hi, table[row], lengths[row])  # type: ignore[index]
        for device, indices in by_device.items():
            zero = self._samples[indices[0]].new_zeros(())  # type: ignore[union-attr]
            extremes = [e if isinstance(e, tuple) else (zero, zero) for e in (self._extremes[i] for i in indices)]
            # The user's own autocast may still be on (watch() inside an autocast block).
            with torch.autocast(torch.device(device).type, enabled=False):
                batch = _batch(extremes, [self._samples[i] for i in indices])  # type: ignore[misc]
            for i, row in zip(indices, batch):
                rows[i] = row
        for i, bound in enumerate(self._extremes):
            if isinstance(bound, list):  # bounds come first: each handle is made after its operands'
                highs = [max(abs(rows[b][0]), abs(rows[b][1])) for b in bound]
                # relu(-inf) = 0, tanh(inf) = 1: a non-finite operand bounds nothing, and the
                # result's own sample is all there is to go by.
                top = max(highs) if all(math.isfinite(h) for h in highs) else rows[i].pop()
                rows[i][0], rows[i][1] = -top, top
            rows[i] = rows[i][:8]
        self._resolved = [_stats(row, n) for row, n in zip(rows, self._numel)]
        return self._resolved

    def sample(self, handle: int) -> torch.Tensor:
        """The values sampled from the tensor of `handle` (float32, or float64 for float64)."""
        s = self._samples[handle]
        return self._rows.row(s) if isinstance(s, int) else s

    def get(self, handle: int | None) -> ValueStats | None:
        return None if handle is None else self.resolve()[handle]

    def merged(self, handles: list[int | None]) -> ValueStats | None:
        return merge_stats([s for h in handles if (s := self.get(h)) is not None])


class _Extremes:
    """A tensor's exact (min, max), by torch.aminmax or by NumPy's min and max, whichever has cost
    less per element lately; the answer is the same either way (both are exact, both give NaN when
    a NaN is there), only the time differs.

    torch's pass runs on all of torch's threads, a parallel region whose threads must all be
    scheduled: on an idle machine it is the faster, while other processes share the cores each
    region can wait a time slice for its second thread (measured on the shared 2-core machine: a
    6 MB activation took 0.4 ms at best and 16 ms at the median). NumPy's two passes run on the
    calling thread alone. Only large float32/float64 CPU tensors are timed; every PROBE-th one
    tries the other way, so the choice follows the machine. A probe of the slower way costs its
    difference (in MiniLM 32×128's traced forward, 71 large results: torch 0.25–0.36 ns per
    element, NumPy 0.74–0.90): every 16th was 4–5 probes, about 3 ms, per forward; every 64th is one.
    """

    PROBE = 64
    LARGE = 1 << 18  # elements; below, either takes microseconds

    def __init__(self) -> None:
        self.cost: dict[str, float] = {}  # seconds per element, smoothed, per way
        self.calls = 0

    def of(self, whole: torch.Tensor, flat: bool) -> tuple[Any, Any]:
        n = whole.numel()
        if not (flat and n >= self.LARGE and whole.device.type == "cpu" and whole.dtype in _NUMPY_EXACT
                and torch.get_num_threads() > 1):
            return torch.aminmax(whole)
        self.calls += 1
        best = min(("torch", "numpy"), key=lambda way: self.cost.get(way, 0.0))
        way = best if self.calls % self.PROBE else ("numpy" if best == "torch" else "torch")
        t0 = time.perf_counter()
        if way == "numpy":
            a = whole.detach().numpy()
            found = (a.min(), a.max())  # NumPy scalars: .item() as a tensor's
        else:
            found = torch.aminmax(whole)
        took = (time.perf_counter() - t0) / n
        self.cost[way] = took if way not in self.cost else 0.7 * self.cost[way] + 0.3 * took
        return found


_NUMPY_EXACT = (torch.float32, torch.float64)
_EXTREMES = _Extremes()


def _batch(extremes: list[tuple[torch.Tensor, torch.Tensor]], samples: list[torch.Tensor]) -> list[list[float]]:
    """One row per tensor: min, max, min_nonzero, nonfinite, below, below_scaled, nonzero, sampled,
    and the sample's own largest magnitude (for results whose operands bound nothing).

    The samples are padded with zeros, which count nowhere (not non-zero, not non-finite, no
    larger than any magnitude). On the CPU the table is computed by NumPy: a few hundred
    thousand values in one thread, where torch's threads would wait on a busy machine.
    """
    if any(s.dtype == torch.float64 for s in samples):
        samples = [s.double() for s in samples]
    lengths = [len(s) for s in samples]
    padded = torch.nn.utils.rnn.pad_sequence(samples, batch_first=True)
    if padded.device.type == "cpu":
        import numpy

        with numpy.errstate(all="ignore"):  # inf * scale is inf, as in torch: no warning
            table = _table(padded.numpy(), numpy)
        lows_highs = [(float(lo), float(hi)) for lo, hi in extremes]
    else:  # one read-back for the whole table: one synchronisation
        columns = torch.stack([c.double() for c in _table(padded, torch)], dim=1)
        ends = torch.stack([torch.stack([lo.double(), hi.double()]) for lo, hi in extremes])
        joined = torch.cat([ends, columns], dim=1).tolist()
        lows_highs, table = [r[:2] for r in joined], [r[2:] for r in joined]
    return [_row(lo, hi, row, n) for (lo, hi), row, n in zip(lows_highs, table, lengths)]


def _row(lo: float, hi: float, row: list[float], n: int) -> list[float]:
    return [lo, hi, *row[:5], float(n), row[5]]


class _SampleRows:
    """The CPU tensors' samples as float32 rows of SAMPLE values, BLOCK rows a block, zero-padded.

    A sample kept as a 16 KB tensor of its own lands in a hole that the step's freed activations left
    in the heap; the next step's activation no longer fits there and the heap grows. Over ten traced
    steps of MiniLM that kept 4.3 GB resident (1.3 GB plain) and took twice the page faults, a
    fresh page for each new activation. A block holds BLOCK samples and leaves the holes whole.
    """

    BLOCK = 256

    def __init__(self) -> None:
        self._blocks: list[torch.Tensor] = []
        self.lengths: list[int] = []

    def add(self, sample: torch.Tensor) -> int:
        """Copy `sample` (≤ SAMPLE values, any floating dtype) into the next row: its index."""
        index = len(self.lengths)
        block, row = divmod(index, self.BLOCK)
        if row == 0:
            self._blocks.append(torch.zeros(self.BLOCK, SAMPLE, dtype=torch.float32, device="cpu"))
        n = sample.numel()
        self._blocks[block][row, :n].copy_(sample)
        self.lengths.append(n)
        return index

    def row(self, index: int) -> torch.Tensor:
        block, row = divmod(index, self.BLOCK)
        return self._blocks[block][row, : self.lengths[index]]

    def table(self) -> list[list[float]]:
        """`_table`'s row for each sample, in order (the zeros past a sample's length count nowhere)."""
        import numpy

        rows: list[list[float]] = []
        with numpy.errstate(all="ignore"):
            for block in self._blocks:
                rows.extend(_table(block.numpy(), numpy))
        return rows[: len(self.lengths)]


def _table(padded: Any, xp: Any) -> Any:
    """min_nonzero, nonfinite, below, below_scaled, nonzero and the largest magnitude per row,
    written once for NumPy arrays and torch tensors alike (`xp` is numpy or torch)."""
    a = xp.abs(padded)
    nonzero = a > 0
    columns = [
        xp.amin(xp.where(nonzero, a, math.inf), 1),
        (~xp.isfinite(a)).sum(1),
        (nonzero & (a < FP16_TINY)).sum(1),
        (nonzero & (a * GRAD_SCALE < FP16_TINY)).sum(1),
        nonzero.sum(1),
        xp.amax(a, 1),  # the sample's largest magnitude (nan/inf kept)
    ]
    if xp is torch:
        return columns
    return xp.stack([c.astype(xp.float64) for c in columns], axis=1).tolist()  # NumPy: rows of floats


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


def _dense(x: torch.Tensor) -> bool:
    """The elements fill one block of memory (a permuted contiguous tensor): strides sorted
    descending are the contiguous strides of the sizes in that order."""
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride()), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's values on this rank (its local shard, the same tensor object every time), or `t`.

    FSDP2's parameters and gradients are DTensors; a rank holds and computes with its shard, so
    that is what the statistics of a real sharded step measure.
    """
    to_local = getattr(t, "to_local", None)
    if to_local is None or not hasattr(t, "placements"):
        return t
    with torch.no_grad():  # without grad, to_local is the stored shard itself (no autograd view)
        return to_local()


def _holds_no_data(t: torch.Tensor) -> bool:
    """A fake tensor (a simulated trace) or a meta one: shapes without values; or a library's
    wrapper subclass (torchao's float8 tensors), which has no storage of its own: the plain
    tensors inside are measured as the ops its handler runs on them are recorded."""
    if library_wrapper(type(t)):
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return t.is_meta or isinstance(t, FakeTensor)
