"""Activation checkpointing's recompute traced beside the forward it replays.

Non-reentrant checkpointing (`torch.utils.checkpoint.checkpoint(use_reentrant=False)`, transformers'
`gradient_checkpointing_enable()`, FSDP2's checkpoint_wrapper) runs a region's forward without
keeping its activations and runs it again in the backward; PyTorch then compares the tensors the
two saved and raises CheckpointError when their metadata differ ("Recomputed values for the
following tensors have different metadata than during the forward pass"). The usual cause is a
precision policy applied to the forward and not to the recompute (an autocast entered around the
forward only, FSDP2's mixed-precision input cast skipped while recomputing: pytorch#148831).

The watch gives each region a recording context for its forward and one for its recompute (the
`context_fn` checkpoint already has, composed with the caller's own), each a dispatch mode that
keeps every torch function's output metadata, inputs and the autocast it ran under; when the recompute ends, the
first op whose output differs is kept, and PyTorch's own check decides whether it raised.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from dtype_doctor.machine.user_code import display_path, first_user_frame, frames_above
from dtype_doctor.numerics import device_name, dtype_name
from dtype_doctor.records import SourceLoc
from dtype_doctor.records.recompute import Recompute, RecomputeDiff


@dataclass(frozen=True)
class _Op:
    op: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    autocast: str | None


def _meta(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)}[{', '.join(str(s) for s in t.shape)}] {device_name(t.device)}"


def _autocast() -> str | None:
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return f"{device}:{dtype_name(torch.get_autocast_dtype(device))}"
    return None


class _Recording(TorchFunctionMode):
    """Every torch function the region calls, with its tensor outputs: above autocast, so each is named as the
    code calls it (linear, relu) with the autocast it ran under, and its output is autocast's."""

    def __init__(self, ops: list[_Op]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat_out, _ = tree_flatten(out)
        outputs = tuple(_meta(t) for t in flat_out if isinstance(t, torch.Tensor))
        if outputs:
            flat_in, _ = tree_flatten((args, kwargs or {}))
            self.ops.append(_Op(getattr(func, "__name__", str(func)), outputs,
                                tuple(dtype_name(t.dtype) for t in flat_in if isinstance(t, torch.Tensor) and t.is_floating_point()),
                                _autocast()))
        return out


@dataclass
class _Region:
    name: str
    source: SourceLoc | None
    forward: list[_Op] = field(default_factory=list)
    recompute: list[_Op] = field(default_factory=list)
    recomputed: bool = False


def _region_name(fn: Any) -> str:
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return type(owner).__name__
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    inner = getattr(fn, "func", None)  # functools.partial (transformers' layer __call__)
    if inner is not None:
        return _region_name(inner)
    return getattr(fn, "__qualname__", type(fn).__name__)


class RecomputeWatch:
    """`with RecomputeWatch() as w:` the step runs; `w.facts()` is what its checkpointed regions did."""

    def __init__(self, is_on: Callable[[], bool] = lambda: True, alias: Mapping[str, str] | None = None) -> None:
        self.is_on = is_on  # whether the traced step is running (regions outside it are not watched)
        self.alias = dict(alias or {})  # a simulation's stand-in devices → the devices the report names (meta → cuda:0)
        self.regions: list[_Region] = []
        self.diffs: list[RecomputeDiff] = []
        self.recomputing = 0  # recomputes in progress: their module calls are the backward's, not new calls of the step
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "RecomputeWatch":
        import torch.utils.checkpoint as cp

        generator, check = cp._checkpoint_without_reentrant_generator, cp._CheckpointFrame.check_recomputed_tensors_match
        watch = self

        def _checkpoint_without_reentrant_generator(fn: Any, preserve_rng_state: bool = True, context_fn: Any = cp.noop_context_fn,
                                                    determinism_check: str = cp._DEFAULT_DETERMINISM_MODE, debug: bool = False,
                                                    early_stop: bool = True, *args: Any, **kwargs: Any) -> Any:
            debugging = cp._checkpoint_debug_enabled if cp._checkpoint_debug_enabled is not None else debug
            if watch.is_on() and not debugging and not torch.compiler.is_compiling():
                context_fn = watch._contexts(fn, context_fn)
            return generator(fn, preserve_rng_state, context_fn, determinism_check, debug, early_stop, *args, **kwargs)

        def check_recomputed_tensors_match(frame: Any, gid: Any) -> None:
            try:
                return check(frame, gid)
            except cp.CheckpointError as error:
                watch._raised(error)
                raise

        cp._checkpoint_without_reentrant_generator = _checkpoint_without_reentrant_generator
        cp._CheckpointFrame.check_recomputed_tensors_match = check_recomputed_tensors_match  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(cp, "_checkpoint_without_reentrant_generator", generator))
        self._undo.append(lambda: setattr(cp._CheckpointFrame, "check_recomputed_tensors_match", check))
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()

    def _contexts(self, fn: Any, context_fn: Any) -> Callable[[], tuple[Any, Any]]:
        frame = first_user_frame(frames_above(2))
        source = SourceLoc(display_path(frame.f_code.co_filename), frame.f_lineno) if frame else None
        region = _Region(_region_name(fn), source)
        self.regions.append(region)

        def contexts() -> tuple[Any, Any]:
            forward, recompute = context_fn()
            return _both(forward, _Recording(region.forward)), _both(recompute, self._recomputing(region))

        return contexts

    @contextlib.contextmanager
    def _recomputing(self, region: _Region) -> Any:
        region.recompute.clear()
        self.recomputing += 1
        try:
            with _Recording(region.recompute):
                yield
        finally:
            self.recomputing -= 1
            region.recomputed = True
            self._compare(region)

    def _compare(self, region: _Region) -> None:
        for i, (f, r) in enumerate(zip(region.forward, region.recompute)):
            if f.op == r.op and f.outputs == r.outputs:
                continue
            named = self._named
            self.diffs.append(RecomputeDiff(region.name, region.source, f.op, i, named(", ".join(f.outputs)),
                                            named(", ".join(r.outputs) if f.op == r.op else f"{r.op} {', '.join(r.outputs)}"),
                                            f.autocast, r.autocast, f.inputs, r.inputs))
            return

    def _named(self, text: str) -> str:
        for stand_in, device in self.alias.items():
            text = text.replace(f" {stand_in}", f" {device}")
        return text

    def _raised(self, error: BaseException) -> None:
        from dtype_doctor.machine.wording import as_device

        words = " ".join(str(error).strip().splitlines()[:4])
        if "meta" in self.alias:
            device = torch.device(self.alias["meta"])
            words = words.replace("device(type='meta')", repr(device))
            words = as_device(words, self.alias["meta"]) or words
        if self.diffs and self.diffs[-1].raised is None:
            import dataclasses

            self.diffs[-1] = dataclasses.replace(self.diffs[-1], raised=f"CheckpointError: {words}")

    def facts(self) -> Recompute | None:
        if not self.regions:
            return None
        return Recompute(len(self.regions), sum(r.recomputed for r in self.regions), tuple(self.diffs))


@contextlib.contextmanager
def _both(first: Any, second: Any) -> Any:
    with first, second:
        yield
