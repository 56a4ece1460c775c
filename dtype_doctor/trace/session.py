"""One traced step's machinery, assembled in one place: `TraceSession`.

`diagnose` (trace/engine.py `trace_model`), `watch`, `dtype-doctor run` (run/session.py) and
`compare` drive it; none of them builds a recorder, a kernel probe or a value probe itself.

    session = TraceSession(model, where=Where(...), recover=True, stats=True)
    session.start()                 # module hooks, the dispatch mode, the function mode(s)
    try:
        out = model(**inputs)       # the step: the caller's own code, or the user's script
    except Exception as exc:
        failure = session.failure(exc)
    finally:
        session.stop()
    trace = session.trace(info, failure)

The function modes go on and off by identity (machine/modes.py), so a mode the user's code
pushes while the session is on stays where it is.
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch.overrides import TorchFunctionMode

from dtype_doctor.machine.placement import Placement
from dtype_doctor.numerics import device_name
from dtype_doctor.records import GradStats, Lineage, ModelInfo, SourceLoc, StandIn, Trace, TraceFailure
from dtype_doctor.records.errors import first_line
from dtype_doctor.trace.heap import long_lived_heap
from dtype_doctor.trace.recorder import Recorder
from dtype_doctor.trace.verdicts import classify_error

# Fake tensors have no values: these are steps a simulated trace cannot take.
_NO_META_KERNEL = "with Meta tensors"  # an op PyTorch gives no shape function (geqrf, histogram)
_SIMULATION_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException")


class TraceSession:
    """The recorder of one step with what it needs: the kernel probe of a simulated target
    (`placement`: the decided machine, whose GPU profile a CUDA one targets; `simulated` also
    without one; `probe_cuda` False for a simulated CPU),
    value statistics (`stats`, real tensors only), CUDA autocast emulation (`amp`), and the
    state a trace on copies swaps in (`state`, `alias` naming a stand-in device as the target).
    A simulated session asks `refusal` (rules.refusal, handed down by the caller) whether a real
    device would raise on an op no kernel can be asked about; None asks only the kernels.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        recover: bool = True,
        stats: bool = False,
        simulated: bool | None = None,
        probe_cuda: bool = True,
        placement: Placement | None = None,
        state: dict[str, torch.Tensor] | None = None,
        alias: Mapping[str, str] | None = None,
        extra_modes: Iterable[TorchFunctionMode] = (),
        refusal: Callable[[Any], str | None] | None = None,
        probe_gpu: str | None = None,
    ) -> None:
        if probe_gpu is not None and placement is None:  # the keyword before the Placement carried the GPU (kept: public API)
            from dtype_doctor.machine.placement import decide

            placement = decide("cuda", simulate=True, gpu=probe_gpu)
        predict = None
        if simulated is None:  # the placement's, or real tensors without one
            simulated = placement is not None and placement.simulated
        if simulated:
            from dtype_doctor.trace.probe import KernelProbe

            gpu = placement.profile if placement is not None and probe_cuda else None
            predict = KernelProbe(cuda=probe_cuda, gpu=gpu, fallback=refusal)
        values = None
        if stats and not simulated:
            from dtype_doctor.trace.values import ValueProbe

            values = ValueProbe()
        self.model = model
        self.simulated = simulated
        self.macos = placement.macos if placement is not None else None  # an mps target's (DD121 reads it)
        self.predict = predict
        self.recorder = Recorder(model, state=state, recover=recover, device_alias=dict(alias or {}), predict=predict, values=values)
        self._extra = tuple(extra_modes)
        self._dispatch: contextlib.ExitStack | None = None
        self._dispatch_mode: Any = None  # the recorder's dispatch mode while the session is on
        self._hook_dicts: dict[int, tuple[Any, int, list]] = {}  # id(module) → (it, hooks then, its hook dicts): unwatched()
        self._function_modes: list[TorchFunctionMode] = []

    # ------------------------------------------------------------------ on and off

    def start(self) -> None:
        from dtype_doctor.machine.modes import push_function_mode

        rec = self.recorder
        rec.attach()  # before the call: the root's own pre-hook tags the forward's inputs
        self._dispatch = contextlib.ExitStack()
        self._dispatch.enter_context(long_lived_heap())  # no full collector pass over the records (trace/heap.py)
        self._dispatch_mode = self._dispatch.enter_context(rec.dispatch_mode())
        self._function_modes = [rec.function_mode(), *self._extra]
        for mode in self._function_modes:
            push_function_mode(mode)

    def stop(self) -> None:
        from dtype_doctor.machine.modes import remove_function_mode

        for mode in reversed(self._function_modes):
            remove_function_mode(mode)
        self._function_modes = []
        if self._dispatch is not None:
            self._dispatch.close()
            self._dispatch = None
        self.recorder.detach()

    @contextlib.contextmanager
    def recording(self) -> Iterator["TraceSession"]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def set_amp(self, dtype: torch.dtype | None) -> None:
        """CUDA's autocast lists applied per function (a simulated CUDA target on a CPU-only build)."""
        from dtype_doctor.trace.cuda_autocast import CudaAutocast

        self.recorder.amp = CudaAutocast(dtype) if dtype is not None else None

    @contextlib.contextmanager
    def cuda_autocast(self, dtype: torch.dtype) -> Iterator[None]:
        """The block runs under CUDA autocast as a GPU would (its thread-local state on, CUDA's lists applied)."""
        from dtype_doctor.trace.cuda_autocast import CudaAutocast

        with CudaAutocast(dtype) as amp:
            self.recorder.amp = amp
            try:
                yield
            finally:
                self.recorder.amp = None

    def suspended(self) -> contextlib.AbstractContextManager[None]:
        """Ops run inside are not the step's (a DataLoader fetch, a second model)."""
        return self.recorder.suspended()

    @contextlib.contextmanager
    def unwatched(self, module: torch.nn.Module, also: Iterable[TorchFunctionMode] = ()) -> Iterator[None]:
        """`module`'s call in the block runs at the script's own pace: the recorder suspended, its hooks on
        `module` and the session's modes (and `also`, a function mode of the caller's) off, put back after
        (machine/modes.py `modes_aside`, trace/unseen.py `hooks_aside`). A tensor subclass's own handlers
        run as in the plain script; a dispatch mode the script pushed above the recorder's keeps the
        recorder's on, suspended."""
        from dtype_doctor.machine.modes import modes_aside
        from dtype_doctor.trace.unseen import hook_dicts, hooks_aside

        handles = self.recorder.hook_handles
        known = self._hook_dicts.get(id(module))
        if known is None or known[0] is not module or known[1] != len(handles):  # again when the recorder hooked more
            known = self._hook_dicts[id(module)] = (module, len(handles), hook_dicts(module.modules(), handles))
        dispatch = self._dispatch_mode if self._dispatch is not None else None
        with self.recorder.suspended(), hooks_aside(known[2]), modes_aside([*self._function_modes, *also], dispatch):
            yield

    # ------------------------------------------------------------------ results

    def failure(self, exc: BaseException) -> TraceFailure:
        """What stopped the step, in the terms the rules read."""
        rec = self.recorder
        message = rec.aliased(first_line(exc, 500))
        if type(exc).__name__ in _SIMULATION_LIMITS or (rec.predict is not None and _NO_META_KERNEL in message):
            module, module_type = self._raising_module(exc)
            return TraceFailure("simulation", f"fake tensors cannot follow this step ({type(exc).__name__}: {message})", module, module_type, None)
        last = next((op for op in reversed(rec.ops) if op.error and not op.recovered), None)
        if last is not None:
            return TraceFailure(classify_error(last.error or message, last.operands), message, last.module, last.module_type, last.op, last.phase)
        module, module_type = self._raising_module(exc)
        return TraceFailure(classify_error(message, ()), message, module, module_type, None)

    def _raising_module(self, exc: BaseException) -> tuple[str, str]:
        """The innermost module whose forward was on the stack when `exc` was raised."""
        found = ("", type(self.model).__name__)
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            owner = frame.f_locals.get("self")
            name = self.recorder.module_name(owner) if isinstance(owner, torch.nn.Module) else None
            if name is not None:
                found = (name, type(owner).__name__)
        return found

    def observe_grads(self, params: Mapping[str, torch.Tensor]) -> list[tuple[str, str, int | None]]:
        """Handles for each trainable parameter's gradient, taken right after the backward."""
        from dtype_doctor.numerics import dtype_name

        rec = self.recorder
        if rec.values is None:
            return []
        named = [(n, p) for n, p in params.items() if isinstance(p, torch.Tensor) and p.grad is not None]
        handles = rec.observe(p.grad for _, p in named)
        return [(n, dtype_name(p.grad.dtype), h) for (n, p), h in zip(named, handles)]

    def trace(
        self,
        info: ModelInfo,
        failure: TraceFailure | None,
        *,
        lineage: Lineage | None = None,
        sources: Mapping[str, SourceLoc] | None = None,
        grads: list[tuple[str, str, int | None]] = (),  # type: ignore[assignment]
        values: str,
        **fields: Any,
    ) -> Trace:
        """The Trace of what the session recorded. `fields` the caller knows better than the
        recording (device, autocast, train, gpu …); otherwise they are read from what ran."""
        rec = self.recorder
        params = list(rec.model.parameters())
        seen = dict(
            inputs=tuple(rec.boundary_inputs),
            device=device_name(params[0].device) if params else "cpu",
            autocast=next((op.autocast for op in rec.ops if op.autocast), None),
            train=any(op.phase == "backward" for op in rec.ops),
        )
        from dtype_doctor.trace.world import shard_groups, world_of

        shards = shard_groups(rec.model)
        seen.update(shards=shards, world=world_of(shards, rec.model))
        if self.predict is not None and self.predict.gpu is not None:
            seen.update(gpu=str(self.predict.gpu), gpu_capability=self.predict.gpu.capability)
        if self.macos is not None:
            seen.update(macos=self.macos)
        # Conditions on values fake tensors cannot decide, taken as torch's own checks' valid branch.
        seen["stand_ins"] = tuple(
            StandIn("Tensor.__bool__", repr(op.attr("assumed")), f"a condition on tensor values in {op.module_type or 'the model'} "
                    "taken as not holding: the branch valid inputs take in torch's own checks")
            for op in rec.ops if op.attr("assumed") is not None
        )
        ops = rec.finished_ops()
        label = self.recorder.device_alias.get("meta")
        if label is not None:  # users read the device the stand-in stands for, in its words (machine/wording.py)
            from dataclasses import replace

            from dtype_doctor.machine.wording import as_device

            ops = tuple(replace(op, error=as_device(op.error, label)) if op.error and "meta" in op.error.lower() else op for op in ops)
            if failure is not None:
                failure = replace(failure, message=as_device(failure.message, label) or "")
        resolved = tuple(GradStats(n, d, s) for n, d, h in grads if rec.values is not None and (s := rec.values.get(h)) is not None)
        modules = rec.finished_modules()
        from dtype_doctor.trace.world import stood_in_values

        stood_in = stood_in_values(seen["world"], rec.model, ops) if values == "measured" else None
        if stood_in is not None:  # not the step's values: none is reported as measured (DD301-DD303 stay silent)
            from dataclasses import replace

            values, resolved = stood_in, ()
            ops = tuple(replace(op, stats=None, operand_stats=None) if op.stats is not None or op.operand_stats is not None else op for op in ops)
            modules = tuple(m.measured(None, None) if m.stats is not None or m.input_stats is not None else m for m in modules)
        return Trace(
            ops=ops,
            modules=modules,
            model=info,
            lineage=dict(lineage or {}),
            failure=failure,
            sources=dict(sources or {}),
            values=values,
            grads=resolved,
            **{**seen, **fields},
        )
