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
import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from dtype_doctor.records import Report, SourceLoc, Subject, TraceFailure
from dtype_doctor.run.models import has_parameters, is_model_call
from dtype_doctor.run.conversions import ConversionLog
from dtype_doctor.run.bindings import CallBindings, bound_at_call
from dtype_doctor.records.errors import StopScript, first_line
from dtype_doctor.machine.control import UserCodeTimeout
from dtype_doctor.run.lineage import (
    Chain,
    Handled,
    LineageBook,
    LineageMode,
    boundary_lineage,
    handled_at_boundary,
    named_inputs,
    patch_datasets,
    sources_of,
    step_input_lineage,
)
from dtype_doctor.machine.simulate import CudaSimulation, SimulationStop
from dtype_doctor.machine.mps_placement import enter_simulation
from dtype_doctor.machine.precision_state import PrecisionWatch
from dtype_doctor.trace.recompute import RecomputeWatch
from dtype_doctor.run.resume import ResumeWatch
from dtype_doctor.run.grads import StepGrads
from dtype_doctor.run.step_inputs import StepInputs
from dtype_doctor.run.step_watch import StepWatch, stopped_early
from dtype_doctor.machine.user_code import user_site
from dtype_doctor.diagnosis import live_trace, report_from_trace
from dtype_doctor.trace.engine import model_info
from dtype_doctor.trace.session import TraceSession
from dtype_doctor.numerics import device_name, dtype_name
from dtype_doctor.trace.request import TraceRequest
from dtype_doctor.machine.placement import CUDA0, HERE, Placement
from dtype_doctor.run.step_report import FindingSources, as_simulated, launched


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
        self.target = torch.device(placement.device or CUDA0) if placement.simulated else None
        self.hide_cuda = hide_cuda
        self.launch = launch  # a LaunchConfig: the script is rank 0 of its world, on the fake process group
        from dtype_doctor.run.trainer_args import TrainerArgsWatch

        self.trainer_args = TrainerArgsWatch(launch, placement.simulated)  # the script's TrainingArguments, read as its launch configuration
        self.alias = placement.aliases  # the simulation's stand-in devices → the devices the report names
        self._session: TraceSession | None = None
        self._failure: TraceFailure | None = None
        self._depth = 0  # top-level module calls in progress (the model's, a loss module's)
        self._model_depth = 0  # the model's own forward in progress
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self._original_call: Any = None
        self._original_next: Any = None
        self._lineage_mode: LineageMode | None = None
        self._unpatch_datasets: Callable[[], None] = lambda: None
        self._simulation: CudaSimulation | None = None
        # A simulated script writes into scratch (machine/disk.py); `keep_writes` is where to keep what it wrote.
        self.disk: Any = None
        self.keep_writes = keep_writes
        self.kept: list[str] = []
        self._conversions = ConversionLog(lambda d: self.alias.get(d, d))
        self.grads = StepGrads(lambda: self._session, lambda: self.report is not None, lambda: self.watch.scale())
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
        self._lineage: dict[str, Chain] = {}
        self._handled: dict[str, Handled] = {}
        # Factory name → the user lines in the model's code that called it without device=, in order.
        self.created: dict[str, list[SourceLoc]] = {}
        from dtype_doctor.run.models import StepModels

        self.models = StepModels()  # the step's models when it calls several (a pipeline's, a teacher and a student)

    # ------------------------------------------------------------------ arming

    def __enter__(self) -> "RunSession":
        try:
            return self._arm()
        except BaseException:
            # An arm that fails (a launch refused, a process group already there) leaves nothing armed:
            # __exit__ never runs for a failed __enter__, and an armed overlay would keep the process's open().
            self._closed = True
            self._disarm()
            self._arms.close()
            raise

    def _arm(self) -> "RunSession":
        if self.placement.simulated:
            from dtype_doctor.machine.disk import Overlay

            self.disk = Overlay(site=user_site)
            self._arms.callback(self._put_away_writes)
            self._arms.enter_context(self.disk)
        self._arms.enter_context(self._conversions)
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
                                                                lambda: self._session.recorder.ops if self._session is not None else ()))
        if self.placement.simulated:
            assert self.target is not None
            self._simulation = enter_simulation(self._arms, self.placement, self.target, on_amp=self._set_amp,
                                                in_forward=lambda: self._model_depth > 0)
            from dtype_doctor.machine.workers import Children

            # DataLoader workers and other child processes see the simulated machine (machine/workers.py).
            self._arms.enter_context(Children(self.disk, str(self._simulation.label), self.placement.gpu, self.placement.gpus))
            from dtype_doctor.machine.fake_packages import CudaOnlyPackages

            self._arms.enter_context(CudaOnlyPackages())  # flash-attn as the target has it (machine/fake_packages.py)
        elif self.hide_cuda:
            self._arms.enter_context(_hidden_cuda())
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
            traced = session._session if session.report is None else None
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
            if self._session is not None and self.report is None:
                self.finish(error)
        finally:
            self._disarm()
            self._arms.close()

    def _disarm(self) -> None:
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
        is_model = repeat = False
        if top_level and self.report is None:
            if self.model is None and is_model_call(module, args, kwargs):
                self._start(module, args, kwargs)
                is_model = True
            elif module is self.model and not self.models.within_pipeline_call():
                # The step(s) end where the next one starts: after N optimizer steps (N forwards without an optimizer).
                done = self.watch.step_done(self.forwards + 1, self.max_steps)
                if not done:
                    self.forwards += 1
                    self._lineage.update(boundary_lineage(self.book, module, args, kwargs))
                    self._next_step()
                    is_model = True
                else:
                    self.finish(None)
                    if not self.keep_running or self.placement.simulated:
                        if self.keep_running:
                            self.note = "--keep-running: a simulated script cannot go on after the traced steps (its CUDA tensors hold no data); stopped"
                        raise StopScript()
            elif self.model is not None and has_parameters(module):
                joined = self._joined(module, args, kwargs)
                if joined is None:
                    return self._unrecorded(original, module, args, kwargs)
                is_model, repeat = joined
        if is_model:
            self.models.called(module)
        self._depth += 1
        self._model_depth += is_model
        try:
            out = original(module, *args, **kwargs)
            if repeat and self._session is not None:
                self._session.recorder.made_by(out, module)
            return out
        except Exception as exc:
            # checkpoint's recompute stops itself once it has what the backward needs: not a failure of the step
            if is_model and self._session is not None and self.report is None and type(exc).__name__ != "_StopRecomputationError":
                self._failure = self._session.failure(exc)
            raise
        finally:
            self._depth -= 1
            self._model_depth -= is_model
            if repeat and self.models.pipeline is None and self._session is not None:
                self._session.recorder.resume_keeping(drop=self._failure is None)

    def _joined(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[bool, bool] | None:
        """How the step takes a top-level call beside its first model: (a model's forward, a repeat), or
        None where it is not the step's (a module called with no tensor, weight_norm's parametrization)."""
        assert self._session is not None
        rec = self._session.recorder
        models = self.models
        if models.pipeline is None and module is not self.model and self._on_step_tensors(args, kwargs):
            # Part of the step: the script's own head on the model's hidden states, a GAN's discriminator.
            rec.adopt(module, _script_name(module))
            return False, self._repeat(module, rec.module_name(module) or "")
        if module is not self.model and not is_model_call(module, args, kwargs):
            return None
        holder = models.holder(module, _user_frame())
        self._several_models()
        if rec.module_name(holder.module) is None and not self.placement.simulated:
            self.grads.arm(holder.module, holder.name)  # a model joining the step: its gradients too
        rec.adopt(holder.module, holder.name, model=holder.module is module)
        rec.adopt(module, holder.name, model=True)  # its forward is a model's, named under its holder
        name = rec.module_name(module) or holder.name
        if holder.name not in models.sites:
            models.sites[holder.name] = user_site(2)
        return True, self._repeat(module, name)

    def _repeat(self, module: torch.nn.Module, name: str) -> bool:
        """With several models, a model called again in the step is recorded (and repaired) but dropped;
        another model's first call ends what a repeat in a pipeline's loop began dropping."""
        if not self.models.several:
            return False
        rec = self._session.recorder  # type: ignore[union-attr]
        if self.models.repeated(module, name):
            rec.pause_keeping()
            return True
        rec.resume_keeping()
        return False

    def _several_models(self) -> None:
        """The step calls more than one model: the first is named as the others are, from here on and back."""
        if not self.models.several:
            self.models.several = True
            self.models.sites.setdefault(self.models.first_name().split(".", 1)[0], self.capture.call_site if self.capture else None)
            self._session.recorder.name_root(self.models.first_name())  # type: ignore[union-attr]
            if not self.placement.simulated:
                self.grads.arm(self.model, self.models.first_name())  # type: ignore[arg-type]

    def _next_step(self) -> None:
        if self.models.several:
            self._session.recorder.resume_keeping()  # type: ignore[union-attr]
            self.models.next_step()

    def _on_step_tensors(self, args: tuple, kwargs: dict) -> bool:
        """A module called on what the step made (the script's own head on the model's hidden states) is
        part of the step, and traced with it; one called on the batch (a teacher) is another model."""
        session = self._session
        if session is None:
            return False
        knows = session.recorder.knows
        return any(isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and knows(t) and t.grad_fn is not None
                   for t in (*args, *kwargs.values()))

    def _unrecorded(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """A second model called in the step (a teacher, a frozen encoder): its ops are not this model's."""
        assert self._session is not None
        self._depth += 1
        try:
            with self._session.suspended():
                return original(module, *args, **kwargs)
        finally:
            self._depth -= 1

    def _start(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        from dtype_doctor.rules import refusal

        self.model = model
        self.forwards = 1
        self.models.begin(model, _user_frame())
        self._info = model_info(model, None, self.alias)
        # A real trace measures values (DD301-DD303 speak about the user's own step); fake tensors hold none.
        session = self._session = TraceSession(model, recover=True, placement=self.placement,
                                               alias=self.alias, extra_modes=[StepInputs(self)], stats=not self.placement.simulated,
                                               refusal=refusal)
        if not self.placement.simulated:
            self.grads.arm(model)
        self.book.is_step_tensor = lambda t: self.report is None and session.recorder.knows(t)
        self._set_amp(self._simulation.amp_dtype if self._simulation else None)
        self._lineage = boundary_lineage(self.book, model, args, kwargs)
        self._handled.update(handled_at_boundary(self.book, model, args, kwargs))
        self.capture = StepCapture(model, named_inputs(model, args, kwargs), user_site(1), self._autocast_now(model),
                                   self._conversions, self._handled, bound_at_call(model, args, kwargs))
        session.start()
        if self.models.pipeline is not None:  # a pipeline's component: its other components are the step's too
            self._several_models()

    @property
    def steps(self) -> int:
        """Steps traced: optimizer steps, or forward calls where the script has no optimizer."""
        return self.watch.steps(self.forwards)

    def _set_amp(self, dtype: torch.dtype | None) -> None:
        if self._session is not None:
            self._session.set_amp(dtype)

    def _autocast_now(self, model: torch.nn.Module) -> str | None:
        if self._simulation is not None:
            dtype = self._simulation.amp_dtype
            return dtype_name(dtype) if dtype is not None else None
        p = next(model.parameters(), None)
        kind = p.device.type if p is not None else "cpu"
        if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
            return dtype_name(torch.get_autocast_dtype(kind))
        return None

    def tag_step_input(self, name: str, t: torch.Tensor, consumer: str) -> None:
        """A pipeline tensor used by the step outside the model (a loss target): name it, keep its lineage."""
        assert self._session is not None
        rec = self._session.recorder
        taken = set(self._lineage) | {m.name for m in rec.boundary_inputs}
        unique, i = name, 2
        while unique in taken:
            unique, i = f"{name}_{i}", i + 1
        rec.tag_input(unique, t)
        self._lineage[unique] = step_input_lineage(self.book, t, consumer, name)
        handled = self.book.handled.get(t)
        if handled is not None:
            from dtype_doctor.run.lineage import as_handled

            self._handled[unique] = as_handled(handled)

    def note_creation(self, factory: str) -> None:
        """The model's code called `factory` (torch.arange, torch.zeros…) without device=: its user line."""
        site = user_site(1)
        if site is not None:
            sites = self.created.setdefault(factory, [])
            if site not in sites:
                sites.append(site)

    # ------------------------------------------------------------------ report

    def finish(self, error: BaseException | None) -> Report:
        """End the trace: `error` is what ended the script during the traced step(s), if anything."""
        assert self._session is not None and self.model is not None
        self._session.stop()
        self._session.recorder.resume_keeping(drop=self._failure is None)
        self._reported = self.models.root() if self.models.several else self.model
        if self.models.several:
            self._info = self.models.frozen(model_info(self._reported, None, self.alias))
        self.models.done()
        self.grads.disarm()
        if self.keep_running and not self.placement.simulated:
            self._disarm()  # the rest of the run goes at full speed
        failure = self._failure
        if isinstance(error, SimulationStop):
            if error.limit is not None and failure is None:
                # A library op with a compiled kernel and no fake implementation, or a CUDA API call the
                # simulation does not answer: a limit of the simulation, named.
                failure = TraceFailure("simulation", f"{error.limit_said} (called at {error.where})", "",
                                       type(self.model).__name__, error.limit, "forward" if error.in_forward else "training step")
            elif error.in_forward and failure is None:
                failure = TraceFailure("simulation", f"fake tensors hold no values, and {error.where} asks for one ({error.what})",
                                       "", type(self.model).__name__, None)
            self.note = (f"the simulation ends at {error.where}: {error.what} needs a value, and simulated CUDA tensors "
                         f"hold none; {min(self.steps, self.max_steps)} of {self.max_steps} step(s) traced up to there, the script stopped")
            if error.limit is not None:
                self.note = (f"the simulation ends at {error.where}: {error.limit_short}; "
                             f"{min(self.steps, self.max_steps)} of {self.max_steps} step(s) traced up to there, the script stopped")
        self._stopped = stopped_early(error, failure)
        if self.placement.simulated:  # the script's own error about a simulated tensor names the device it stands for
            from dtype_doctor.machine.wording import as_device

            self._stopped = as_device(self._stopped, device_name(self.target))  # type: ignore[arg-type]
        report = self._report(failure)
        if failure is None and error is not None and not isinstance(error, (StopScript, SystemExit, KeyboardInterrupt, UserCodeTimeout)):
            # Raised outside the model's forward (the loss, GradScaler, the optimizer; a time-out is the doctor's limit, said in
            # the coverage, never a DD001). When no error-level finding explains it, the step is not clean: the trace stopped early.
            if not report.at_or_above("error"):
                failure = TraceFailure("other", f"{type(error).__name__}: {first_line(error)}", "", type(self.model).__name__, None, "training step")
                report = self._report(failure)
        self.report = report
        if self.on_report is not None:
            with self.disk.paused() if self.disk is not None else contextlib.nullcontext():
                self.on_report(report)  # the report file is the doctor's to write
        return report

    def _put_away_writes(self) -> None:
        """After the script: what it wrote is kept where --keep-writes says, and the scratch directory goes."""
        try:
            if self.keep_writes is not None:
                self.kept = self.disk.keep(self.keep_writes)
        finally:
            self.disk.cleanup()

    def _report(self, failure: TraceFailure | None) -> Report:
        assert self._session is not None and self.model is not None
        trace = live_trace(self._session, self._info, failure, lineage=self._lineage, sources=sources_of(self._lineage))
        if self.placement.simulated:
            trace = as_simulated(trace, self.placement, self.target, self.model, self._simulation, self.disk)
        values = self._session.recorder.values
        if values is not None and self.grads.handles:
            trace = dataclasses.replace(trace, grads=self.grads.stats(values), grad_scaler=bool(self.watch.scaler_calls))
        coverage = self.watch.coverage(trace, self.forwards, getattr(self, "_stopped", None))
        coverage = dataclasses.replace(coverage, compiled=self.compiles.regions(self._reported, {m.name for m in trace.modules}),
                                       skipped=tuple(self.models.repeats.items()), dropped_ops=self._session.recorder.dropped,
                                       not_simulated=tuple(self._simulation.not_simulated) if self._simulation else ())
        loaded = None if self.models.several else self.loads.facts_of(self.model)
        trace = dataclasses.replace(trace, coverage=coverage, scaler=self.watch.scaler_class(), scaler_off=self.watch.scaler_off,
                                    optimizers=self.watch.optimizer_groups(), loaded=loaded, precision=self.precision.state(),
                                    recompute=self.recompute.facts(), resume=self.resume.facts())
        if self.launch is not None:
            trace = launched(trace, self.launch)
        if self.trainer_args.launch is not None:  # the script's TrainingArguments: their precision and DeepSpeed config
            trace = dataclasses.replace(trace, launch=self.trainer_args.launch)
        request = TraceRequest(select=self.select, ignore=self.ignore, subject=Subject(model=self.label))
        report = report_from_trace(trace, self._reported, request)
        sources = FindingSources(self._reported, self._info, self.models, self.loads, self._conversions, self.created,
                                 self._handled, self._lineage, self.capture.bound if self.capture else CallBindings())
        findings = tuple(sources.placed(f) for f in report.findings)
        environment = dict(report.environment)
        if self.placement.simulated or self.hide_cuda:
            environment["cuda_available"] = _real_cuda_available()
        return dataclasses.replace(report, findings=findings, environment=environment, target=self.loads.with_component_loads(report.target, self._reported))

@contextlib.contextmanager
def _hidden_cuda() -> Any:
    """`run --device cpu` on a machine with a GPU: the script sees none, as on a CPU-only machine."""
    cuda = torch.cuda
    saved = {name: cuda.__dict__[name] for name in ("is_available", "device_count")}
    cuda.is_available = lambda: False  # type: ignore[assignment]
    cuda.device_count = lambda: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cuda, name, fn)


_REAL_IS_AVAILABLE = torch.cuda.is_available


def _real_cuda_available() -> bool:
    return bool(_REAL_IS_AVAILABLE())


def _script_name(module: torch.nn.Module) -> str:
    """What the script calls a module it runs beside the model (`head`), else its class."""
    from dtype_doctor.machine.user_code import first_user_frame, frames_above

    frame = first_user_frame(frames_above(1))
    if frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            name = next((k for k, v in scope.items() if v is module and not k.startswith("_")), None)
            if name is not None:
                return name
    return type(module).__name__


def _user_frame() -> Any:
    from dtype_doctor.machine.user_code import first_user_frame, frames_above

    return first_user_frame(frames_above(2))
