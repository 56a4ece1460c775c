"""The measurements behind a row: peak memory, time, and per-op / per-module numerics.

Peak memory on CUDA is torch.cuda.max_memory_allocated over the bytes allocated before the
run. On CPU there is no allocator to ask, so LiveBytes tracks it: every op output seen by
a TorchDispatchMode whose storage is new adds its bytes, and a weakref finalizer on each
tensor takes them away when the last tensor on that storage dies ("tracked tensor bytes").
Either way the row's peak is its weights + inputs + what the run held at most beyond them.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dtype_doctor.compare.records import OpError
from dtype_doctor.ops.families import PRECISION_OPS
from dtype_doctor.numerics import tensors_in

CUDA_PEAK = "torch.cuda.max_memory_allocated"
TRACKED_PEAK = "tracked tensor bytes"
REFERENCE_STORE_LIMIT = 2 * 1024**3  # fp32 copies of the reference's op outputs kept at most


def peak_method(device: torch.device) -> str:
    return CUDA_PEAK if device.type == "cuda" else TRACKED_PEAK


def tensor_bytes(values: Any) -> int:
    leaves, _ = tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that op outputs newly allocated and that are still alive; the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[tuple[str, int], list[int]] = {}  # key → [tensors alive on it, bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        before = {_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, before)
        return out

    def _track(self, t: torch.Tensor, operands: set[tuple[str, int]]) -> None:
        key = _key(t)
        if key is None:
            return
        entry = self._storages.get(key)
        if entry is None:
            if key in operands:  # a view of, or a write into, a tensor from before (weights, inputs)
                return
            nbytes = t.untyped_storage().nbytes()
            if not nbytes:
                return
            entry = self._storages[key] = [0, nbytes]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: tuple[str, int]) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            self.live -= entry[1]
            del self._storages[key]


def _key(t: torch.Tensor) -> tuple[str, int] | None:
    """The storage `t` lives on; None for a wrapper subclass (torchao's MX weights), whose inner tensors are counted."""
    try:
        return (str(t.device), t.untyped_storage().data_ptr())
    except RuntimeError:
        return None


def run_peak(run: Callable[[], Any], device: torch.device) -> int:
    """The most bytes `run` held at once beyond what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - base)
    tracker = LiveBytes()
    with tracker:
        run()
    return tracker.peak


def run_times(run: Callable[[], Any], device: torch.device, repeat: int) -> tuple[float, ...]:
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return tuple(times)


# ------------------------------------------------------------------ numerics


OpKey = tuple[str, str, int]  # (module, op, occurrence)


@dataclass(frozen=True)
class Numerics:
    """What a probed forward saw: the matmul/conv outputs (reference) or their errors (row),
    and the modules whose outputs had inf/NaN, in the order they produced them."""

    outputs: Mapping[OpKey, torch.Tensor]
    errors: tuple[OpError, ...]
    nonfinite: tuple[str, ...]


class _Probe(TorchDispatchMode):
    def __init__(self, stack: list[str], reference: Mapping[OpKey, torch.Tensor] | None) -> None:
        super().__init__()
        self.stack = stack
        self.reference = reference
        self.seen: dict[tuple[str, str], int] = {}
        self.outputs: dict[OpKey, torch.Tensor] = {}
        self.stored = 0
        self.errors: list[OpError] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        first = next(iter(tensors_in(out)), None)
        if name in PRECISION_OPS and first is not None and first.is_floating_point():
            module = self.stack[-1] if self.stack else ""
            n = self.seen.get((module, name), 0)
            self.seen[(module, name)] = n + 1
            key = (module, name, n)
            if self.reference is None:
                self._store(key, first)
            elif key in self.reference:
                self.errors.append(
                    OpError(str(func), module, n, rel_error(self.reference[key], first), _own_error(func, args, kwargs, first))
                )
        return out

    def _store(self, key: OpKey, t: torch.Tensor) -> None:
        nbytes = t.numel() * 4
        if self.stored + nbytes <= REFERENCE_STORE_LIMIT:
            self.stored += nbytes
            self.outputs[key] = t.detach().to("cpu", torch.float32, copy=True)


def rel_error(reference: torch.Tensor, got: torch.Tensor) -> float:
    """max |got - reference| / max |reference|; inf where got is not finite."""
    if reference.shape != got.shape:
        return math.nan
    got = got.detach().to("cpu", torch.float32)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    if not reference.numel():
        return 0.0
    scale = reference.abs().max().item()
    diff = (got - reference).abs().max().item()
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def _own_error(func: Any, args: tuple, kwargs: Mapping[str, Any], got: torch.Tensor) -> float | None:
    """The op's own error: itself recomputed in float32 on the row's operands (upcast); inf
    where the op itself overflowed (its float32 result is finite, its own is not)."""
    if got.dtype == torch.float32:
        return None

    def up(v: Any) -> Any:
        return v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    try:
        with torch.autocast(got.device.type, enabled=False):
            exact = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - a kernel with no float32 path (flash attention) has no own error
        return None
    exact = next(iter(tensors_in(exact)), None)
    if exact is None or not bool(torch.isfinite(exact).all()):
        return None  # operands already inf/NaN: the error is inherited, the op adds none of its own
    return rel_error(exact.detach().to("cpu", torch.float32), got)


@contextlib.contextmanager
def _module_hooks(model: torch.nn.Module, stack: list[str], nonfinite: dict[str, None]) -> Iterator[None]:
    names = {id(m): n for n, m in model.named_modules()}

    def enter(mod: torch.nn.Module, _args: Any) -> None:
        stack.append(names.get(id(mod), ""))

    def leave(mod: torch.nn.Module, _args: Any, out: Any) -> None:
        if stack:
            stack.pop()
        name = names.get(id(mod), "")
        if name not in nonfinite and any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors_in(out)):
            nonfinite[name] = None

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def probe(
    model: torch.nn.Module, run: Callable[[], Any], reference: Mapping[OpKey, torch.Tensor] | None = None
) -> tuple[Any, Numerics]:
    """Run `run` once with the op probe and the module hooks; returns its result and what they saw.

    Without `reference` the matmul/conv outputs are kept (in float32, on the CPU) to be the
    reference; with it, each matching op's error against it is measured."""
    stack: list[str] = []
    nonfinite: dict[str, None] = {}
    mode = _Probe(stack, reference)
    with _module_hooks(model, stack, nonfinite), mode:
        result = run()
    return result, Numerics(mode.outputs, tuple(mode.errors), tuple(nonfinite))


def worst(errors: tuple[OpError, ...]) -> OpError | None:
    """The op whose output is furthest from fp32 (inf first; NaN, a shape that differs, never)."""
    ranked = [e for e in errors if not math.isnan(e.rel_error)]
    return max(ranked, key=lambda e: e.rel_error, default=None)
