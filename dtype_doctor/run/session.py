"""Arm the recorder around the user's script and trace its first step(s).

While the script runs, `torch.nn.Module.__call__` is wrapped: the first top-level call of a
module that has parameters is the model, and starts the recorder (module hooks plus the
dispatch mode, repair-and-continue, so every mismatch of the step is seen). Everything up
to the model's next top-level call — loss, backward, GradScaler, optimizer — belongs to
the step. When step N+1 would start, the trace ends, the report is handed on, and the
script is stopped (or, with keep_running, left to go on unwatched).

Pipeline tensors the step uses outside the model (a loss target, a tensor the user's loss
multiplies with) are named and given their lineage where they meet the step's own tensors,
so their findings point at the user's lines too. With `simulate`, the script sees a CUDA
machine (machine/simulate.py) and the recorder asks real kernels for CUDA's verdicts, as
`diagnose(simulate=True)` does.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from dtype_doctor.records import Report, SourceLoc, TraceFailure
from dtype_doctor.run.models import has_parameters, is_model_call
from dtype_doctor.run.conversions import ConversionLog
from dtype_doctor.run.bindings import CallBindings, bound_at_call
from dtype_doctor.records.errors import StopScript
from dtype_doctor.run.lineage import (
    Chain,
    Handled,
    LineageBook,
    LineageMode,
    boundary_lineage,
    handled_at_boundary,
    named_inputs,
    patch_datasets,
)
from dtype_doctor.machine.precision_state import PrecisionWatch
from dtype_doctor.trace.recompute import RecomputeWatch
from dtype_doctor.run.resume import ResumeWatch
from dtype_doctor.run.grads import StepGrads
from dtype_doctor.run.step_inputs import StepInputs
from dtype_doctor.run.step_watch import StepWatch
from dtype_doctor.machine.user_code import user_site
from dtype_doctor.trace.engine import model_info
from dtype_doctor.trace.session import TraceSession
from dtype_doctor.numerics import dtype_name
from dtype_doctor.machine.placement import HERE, Placement
from dtype_doctor.machine.mps_placement import stopped_on_a_mac
from dtype_doctor.run.step_joins import UNWATCHED, StepJoins, user_frame_of_call
from dtype_doctor.run.step_report import StepEnd
from dtype_doctor.run.surface import ScriptSurface


@dataclass(frozen=True)
class StepCapture:
    """The first traced step as `fix --run` needs it: the model, its call's inputs by name, where it was called."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    call_site: SourceLoc | None
    autocast: str | None  # the autocast dtype the forward ran under
    conversions: ConversionLog = field(compare=False, repr=False)
    # Input name (and loss target) → the last user line that handled it before the step took it.
    handled: dict[str, Handled] = field(default_factory=dict, compare=False, repr=False)
    # Where the user's code last bound the model and each input it passed (the line a dropped move belongs on).
    bound: CallBindings = field(default_factory=CallBindings, compare=False, repr=False)


class RunSession:
    """`with RunSession(...) as s: s.close(launch(command))`; `s.report` is the traced step(s), or None."""

    def __init__(
        self,
        *,
        steps: int = 1,
        keep_running: bool = False,
        select: Iterable[str] | str | None = None,
        ignore: Iterable[str] | str | None = None,
        on_report: Callable[[Report], None] | None = None,
        label: str | None = None,
        placement: Placement = HERE,
        hide_cuda: bool = False,
        launch: Any = None,
        keep_writes: str | None = None,
    ) -> None:
        self.label = label  # what the report names as the target: the script
        self.max_steps = steps
        self.keep_running = keep_running
        self.select, self.ignore = select, ignore
        self.on_report = on_report
        self.report: Report | None = None
        self.model: torch.nn.Module | None = None
        self.forwards = 0  # the model's top-level calls traced
        self.capture: StepCapture | None = None
        self.note: str | None = None  # why the trace ended where it did, when the script did not decide it
        self.placement = placement  # decided at the entry (RunOptions.placement); simulated GPUs: with several, cuda:k lives on meta:k
        self.surface = ScriptSurface(placement, hide_cuda=hide_cuda, keep_writes=keep_writes)  # the machine the script sees
        self.launch = launch  # a LaunchConfig: the script is rank 0 of its world, on the fake process group
        from dtype_doctor.run.trainer_args import TrainerArgsWatch

        self.trainer_args = TrainerArgsWatch(launch, placement.simulated)  # the script's TrainingArguments, read as its launch configuration
        self.alias = placement.aliases  # the simulation's stand-in devices → the devices the report names
        self.traced: TraceSession | None = None
        self.failure: TraceFailure | None = None
        self._depth = 0  # top-level module calls in progress (the model's, a loss module's)
        self.model_depth = 0  # the model's own forward in progress
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self._original_call: Any = None
        self._original_next: Any = None
        self._lineage_mode: LineageMode | None = None
        self._unpatch_datasets: Callable[[], None] = lambda: None
        self.conversions = ConversionLog(lambda d: self.alias.get(d, d))
        self.grads = StepGrads(lambda: self.traced, lambda: self.report is not None, lambda: self.watch.scale())
        self.watch = StepWatch(lambda: self.model is not None and self.report is None, self.grads.optimizer_stepping)
        from dtype_doctor.run.compiled import CompileWatch

        self.compiles = CompileWatch(lambda: self.model is not None and self.report is None)  # torch.compile's regions
        from dtype_doctor.run.loads import LoadWatch

        self.loads = LoadWatch()  # the script's from_pretrained calls: target.loaded_dtype
        self.precision = PrecisionWatch()  # the process's precision switches, who set them, the TF32 reads refused
        self._arms = contextlib.ExitStack()
        self._closed = False
        # Lineage is the pipeline's: inside the model the recorder sees everything.
        self.book = LineageBook(is_paused=lambda: self._depth > 0, device_alias=self.alias)
        self.lineage: dict[str, Chain] = {}
        self.handled: dict[str, Handled] = {}
        # Factory name → the user lines in the model's code that called it without device=, in order.
        self.created: dict[str, list[SourceLoc]] = {}
        from dtype_doctor.run.models import StepModels

        self.models = StepModels()  # the step's models when it calls several (a pipeline's, a teacher and a student)
        self.joins = StepJoins(self)  # how the step takes the calls beside its first model
        self.end = StepEnd(self)  # the end of the traced step(s) and their report
        self.info: Any = None  # the traced model's ModelInfo

    # ------------------------------------------------------------------ arming

    def __enter__(self) -> "RunSession":
        try:
            return self._arm()
        except BaseException:
            # An arm that fails (a launch refused, a process group already there) leaves nothing armed:
            # __exit__ never runs for a failed __enter__, and an armed overlay would keep the process's open().
            self._closed = True
            self.disarm()
            self._arms.close()
            raise

    def _arm(self) -> "RunSession":
        self.surface.arm_disk(self._arms)
        self._arms.enter_context(self.conversions)
        if self.launch is not None:
            from dtype_doctor.run.launchers import launch_env
            from dtype_doctor.trace.world import fake_launch

            self._arms.enter_context(fake_launch(self.launch.processes, self.launch.launcher, launch_env(self.launch)))
        self._arms.enter_context(self.watch)
        self._arms.enter_context(self.compiles)
        self._arms.enter_context(self.trainer_args)
        self._arms.enter_context(self.loads)
        self._arms.enter_context(self.precision)
        self.recompute = self._arms.enter_context(RecomputeWatch(lambda: self.model is not None and self.report is None, self.alias))
        self.resume = self._arms.enter_context(ResumeWatch(self._parameter_ids, self.alias, lambda: self.model is not None and self.report is None,
                                                                lambda: self.traced.recorder.ops if self.traced is not None else ()))
        self.surface.arm_machine(self._arms, on_amp=self._set_amp, in_forward=lambda: self.model_depth > 0)
        original = torch.nn.Module.__call__
        session = self

        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return session._call(original, module, args, kwargs)

        self._original_call = original
        torch.nn.Module.__call__ = __call__  # type: ignore[method-assign]
        self._patch_loader()
        self._lineage_mode = LineageMode(self.book)
        self._lineage_mode.__enter__()
        self._unpatch_datasets = patch_datasets(self.book)
        return self

    def _parameter_ids(self) -> dict[int, str]:
        """id(parameter) → its name in the traced model (the resume's findings name parameters so)."""
        model = self.model
        return {id(p): name for name, p in model.named_parameters()} if model is not None else {}

    def _patch_loader(self) -> None:
        """Fetching the next batch is not part of the step: its ops (formatters, collate) are not recorded."""
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original = _BaseDataLoaderIter.__next__
        session = self

        def __next__(it: Any) -> Any:
            traced = session.traced if session.report is None else None
            if traced is None:
                return original(it)
            with traced.suspended():
                return original(it)

        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        self._original_next = original

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.close(exc)
        return False

    def close(self, error: BaseException | None) -> None:
        """The script ended, with `error` (an exception, a stop) or normally: end the trace if it is still on."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.traced is not None and self.report is None:
                self.finish(error)
        finally:
            self.disarm()
            self._arms.close()

    def disarm(self) -> None:
        if self._lineage_mode is not None:
            self._lineage_mode.__exit__(None, None, None)
            self._lineage_mode = None
            self._unpatch_datasets()
        if self._original_next is not None:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            _BaseDataLoaderIter.__next__ = self._original_next  # type: ignore[method-assign]
            self._original_next = None
        if self._original_call is not None:
            torch.nn.Module.__call__ = self._original_call  # type: ignore[method-assign]
            self._original_call = None

    # ------------------------------------------------------------------- calls

    def _call(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        # a checkpointed region's recompute runs in the backward: its calls are not the step's next ones
        top_level = self._depth == 0 and threading.get_ident() == self._thread and os.getpid() == self._pid and not self.recompute.recomputing
        is_model, repeat = False, None
        if top_level and self.report is None:
            if self.model is None and is_model_call(module, args, kwargs):
                self._start(module, args, kwargs)
                is_model = True
            elif module is self.model and not self.models.within_pipeline_call():
                # The step(s) end where the next one starts: after N optimizer steps (N forwards without an optimizer).
                done = self.watch.step_done(self.forwards + 1, self.max_steps)
                if not done:
                    self.forwards += 1
                    self.lineage.update(boundary_lineage(self.book, module, args, kwargs, user_site(1)))
                    self.joins.next_step()
                    is_model = True
                else:
                    self.finish(None)
                    if not self.keep_running or self.placement.simulated:
                        if self.keep_running:
                            self.note = "--keep-running: a simulated script cannot go on after the traced steps (its CUDA tensors hold no data); stopped"
                        elif self.placement.apple:
                            self.note = stopped_on_a_mac()
                        raise StopScript()
            elif self.model is not None and has_parameters(module):
                joined = self.joins.joined(module, args, kwargs)
                if joined is None:
                    return self._unrecorded(original, module, args, kwargs)
                is_model, repeat = joined
        if is_model:
            self.models.called(module)
        if repeat == UNWATCHED:
            return self._unrecorded(original, module, args, kwargs, made=True)
        self._depth += 1
        self.model_depth += is_model
        try:
            out = original(module, *args, **kwargs)
            if repeat and self.traced is not None:
                self.traced.recorder.made_by(out, module)
            return out
        except Exception as exc:
            # checkpoint's recompute stops itself once it has what the backward needs: not a failure of the step
            if is_model and self.traced is not None and self.report is None and type(exc).__name__ != "_StopRecomputationError":
                self.failure = self.traced.failure(exc)
            raise
        finally:
            self._depth -= 1
            self.model_depth -= is_model
            if repeat and self.models.pipeline is None and self.traced is not None:
                self.traced.recorder.resume_keeping(drop=self.failure is None)

    def _unrecorded(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict, made: bool = False) -> Any:
        """A second model called in the step (a teacher, a frozen encoder): its ops are not this model's.
        With `made`, a model's repeat run unwatched: what it returns is still known as that model's output."""
        assert self.traced is not None
        self._depth += 1
        self.model_depth += made
        try:
            if made:  # the modes and hooks off too (trace/session.py): the script's own pace
                with self.traced.unwatched(module, also=[self._lineage_mode] if self._lineage_mode is not None else []):
                    out = original(module, *args, **kwargs)
            else:
                with self.traced.suspended():
                    out = original(module, *args, **kwargs)
            if made:
                self.traced.recorder.made_by(out, module)
            return out
        finally:
            self._depth -= 1
            self.model_depth -= made

    def _start(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        from dtype_doctor.rules import refusal

        self.model = model
        self.forwards = 1
        self.models.begin(model, user_frame_of_call())
        self.info = model_info(model, None, self.alias)
        # A real trace measures values (DD301-DD303 speak about the user's own step); fake tensors hold none.
        session = self.traced = TraceSession(model, recover=True, placement=self.placement,
                                               alias=self.alias, extra_modes=[StepInputs(self)], stats=not self.placement.simulated,
                                               refusal=refusal)
        if not self.placement.simulated:
            self.grads.arm(model)
        self.book.is_step_tensor = lambda t: self.report is None and session.recorder.knows(t)
        self.book.step_started()
        self._set_amp(self.surface.amp_dtype)
        call_site = user_site(1)
        self.lineage = boundary_lineage(self.book, model, args, kwargs, call_site)
        self.handled.update(handled_at_boundary(self.book, model, args, kwargs))
        self.capture = StepCapture(model, named_inputs(model, args, kwargs), call_site, self._autocast_now(model),
                                   self.conversions, self.handled, bound_at_call(model, args, kwargs))
        session.start()
        if self.models.pipeline is not None:  # a pipeline's component: its other components are the step's too
            self.joins.several_models()

    @property
    def steps(self) -> int:
        """Steps traced: optimizer steps, or forward calls where the script has no optimizer."""
        return self.watch.steps(self.forwards)

    def _set_amp(self, dtype: torch.dtype | None) -> None:
        if self.traced is not None:
            self.traced.set_amp(dtype)

    def _autocast_now(self, model: torch.nn.Module) -> str | None:
        if self.surface.simulation is not None:
            dtype = self.surface.amp_dtype
            return dtype_name(dtype) if dtype is not None else None
        p = next(model.parameters(), None)
        kind = p.device.type if p is not None else "cpu"
        if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
            return dtype_name(torch.get_autocast_dtype(kind))
        return None

    # ------------------------------------------------------------------ report

    def finish(self, error: BaseException | None) -> Report:
        """End the trace: `error` is what ended the script during the traced step(s), if anything."""
        return self.end.finish(error)

    @property
    def kept(self) -> list[str]:
        """What the simulated script wrote, kept where --keep-writes said."""
        return self.surface.kept
