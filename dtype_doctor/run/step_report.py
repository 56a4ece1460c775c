"""What a run's traced step becomes in its report, beside the session that traced it
(run/session.py's RunSession): the trace as rank 0 of a launcher's world, the trace as the
simulated CUDA machine's, and each finding's user line (the line that made, moved, converted or
loaded the tensors it names). Moved out of RunSession as they were, so the session holds the
script's execution and this module its report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from dtype_doctor.machine.home import STAND_IN
from dtype_doctor.machine.placement import Placement
from dtype_doctor.numerics import device_name
from dtype_doctor.records import ModelInfo, SourceLoc, Trace


def launched(trace: Trace, launch: Any) -> Trace:
    """The trace as rank 0 of the launcher's world, with the launch configuration it was given."""
    from dtype_doctor.records import World

    world = trace.world or World(launch.processes, 0, "fake", launch.launcher)
    config = tuple((k, v) for k, v in (("mixed_precision", launch.mixed_precision), ("distributed", launch.distributed),
                                        ("config_file", launch.config_file), ("deepspeed_config", launch.deepspeed_config),
                                        ("fp16", launch.ds_fp16), ("bf16", launch.ds_bf16), ("zero_stage", launch.zero_stage),
                                        ("offload", list(launch.offload) or None)) if v is not None)
    world = dataclasses.replace(world, size=launch.processes, launcher=launch.launcher, config=config)
    return dataclasses.replace(trace, launch=launch, world=world)


def as_simulated(trace: Trace, placement: Placement, target: torch.device, model: torch.nn.Module | None,
                 simulation: Any, disk: Any) -> Trace:
    """The trace as a CUDA machine's: the stand-in named as the target; values asked of fake tensors dropped."""
    from dtype_doctor.machine.simulate import NO_DATA
    from dtype_doctor.machine.wording import as_device

    label = device_name(target)
    no_data = [*NO_DATA, *(as_device(s, label) for s in NO_DATA)]
    ops = tuple(op for op in trace.ops if not (op.error and any(s in op.error for s in no_data)))
    gpu = placement.profile
    device = placement.aliases.get(trace.device) or (label if trace.device == device_name(STAND_IN) else trace.device)
    plan = None
    if placement.gpus > 1 and model is not None:
        from dtype_doctor.machine.device_map import plan_of

        plan = plan_of(model, placement.gpus, gpu)
    stand_ins = trace.stand_ins + (tuple(simulation.stand_ins.taken) if simulation is not None else ())
    writes = disk.held() if disk is not None else ()
    return dataclasses.replace(trace, ops=ops, device=device, simulated=True, gpu=str(gpu) if gpu else None,
                               gpu_capability=gpu.capability if gpu else None, devices=plan, stand_ins=stand_ins,
                               writes=writes)


@dataclass(frozen=True)
class FindingSources:
    """The user's line each finding names, from what the run saw: the model reported (`reported`,
    the container of several), its ModelInfo, the models and loads watched, the conversions
    logged, the lines that made tensors without device= (`created`), handled step inputs and their lineage."""

    reported: torch.nn.Module
    info: ModelInfo
    models: Any  # run.models' watch of the models the step called
    loads: Any  # run.loads' watch of from_pretrained
    conversions: Any  # run.conversions.ConversionLog
    created: dict[str, list[SourceLoc]]
    handled: dict[str, Any]
    lineage: Any  # run.lineage's record of the step inputs' origins
    bound: Any  # run.bindings.CallBindings: the lines that last bound the model and its inputs

    def placed(self, finding: Any) -> Any:
        """The finding with its source: its parameters' conversion or load, a created tensor's line,
        a moved tensor's line, a whole model's dtype line, in that order of precedence."""
        placed = self._with_model_source(self._with_move_source(self._with_creation_source(self._with_parameter_source(finding))))
        return self._with_autocast_source(placed)

    def _with_autocast_source(self, finding: Any) -> Any:
        """A half dtype the script's autocast chose (DD107: bfloat16 autocast on a T4) names the line that
        made that autocast (`ctx = ... torch.amp.autocast(..., dtype=torch.bfloat16)`), where its dtype is."""
        made = getattr(self.bound, "autocast", None)
        if finding.source is not None or made is None or finding.code != "DD107":
            return finding
        return dataclasses.replace(finding, source=made)

    def _with_creation_source(self, finding: Any) -> Any:
        """A finding on a tensor the model's code made without device= names the user's line that
        made it, in the words of that line ("torch.arange at model.py:96"), never an aten overload."""
        from dtype_doctor.run.created import with_creation_source

        return with_creation_source(finding, self.created, self.reported)

    def _with_move_source(self, finding: Any) -> Any:
        """A device mismatch on a pipeline tensor names the last user line that handled it before the
        step took it: where the move the script dropped belongs."""
        from dtype_doctor.run.created import with_bound_source, with_made_source, with_move_source

        moved = with_bound_source(with_move_source(finding, self.handled), self.bound, self.handled)
        return with_made_source(moved, self.lineage, self.reported)

    def _with_model_source(self, finding: Any) -> Any:
        """A finding about one of several models as a whole (DD801, DD802) names the user's line that gave
        that model its dtype (pipe.unet.to(torch.bfloat16), or the from_pretrained that loaded it so),
        else the line that first called it."""
        if not self.models.several or not finding.module:
            return finding
        if finding.source is not None and not _moves_the_model(finding):
            return finding
        from dtype_doctor.rules.components import component_dtypes

        head = finding.module.split(".", 1)[0]
        dtype = component_dtypes(self.info).get(head)
        source = self.conversions.source_for(self.reported, head, dtype=dtype) if dtype else None
        source = source or self.loads.site_of(dict(self.reported.named_children()).get(head), dtype=dtype)
        source = source or self.models.sites.get(head)
        return dataclasses.replace(finding, source=source) if source is not None else finding

    def _with_parameter_source(self, finding: Any) -> Any:
        """A finding about parameters names the user's line that converted them (model.half()), else
        the from_pretrained line that loaded them in their dtype (dtype=torch.float16)."""
        if finding.source is not None:
            return finding
        held = [(t, t.origin.split(":", 1)[1]) for t in finding.tensors if t.origin and t.origin.startswith(("param:", "buffer:"))]
        if finding.code == "DD201" and finding.module and self.models.several:  # another model's weights: its line first
            held.sort(key=lambda h: h[1].split(".", 1)[0] == finding.module.split(".", 1)[0])
        sources = (self.conversions.source_for(self.reported, name, dtype=t.dtype) for t, name in held)
        # the load only for the finding's own weights: an input made from another model's weights is not theirs
        loads = ((site, t.dtype) for t, name in held if t.role in ("weight", "bias", "buffer")
                 and (site := self._load_site(name, t.dtype)) is not None)
        from dtype_doctor.run.bindings import dtype_decided_at

        source = next((s for s in sources if s is not None), None) or next((dtype_decided_at(s, d) for s, d in loads), None)
        return dataclasses.replace(finding, source=source) if source is not None else finding

    def _load_site(self, name: str, dtype: str) -> Any:
        """The user's from_pretrained line that loaded the model holding parameter `name` in `dtype`."""
        model = dict(self.reported.named_children()).get(name.split(".", 1)[0]) if self.models.several else self.reported
        return self.loads.site_of(model, dtype=dtype)


def _moves_the_model(finding: Any) -> bool:
    """A DD201 whose remedy moves one of several models (a text encoder left on the CPU): it names the
    line that placed that model, where its device belongs, not the input that met it."""
    return finding.code == "DD201" and any(r.target == "model" for r in finding.remedies)


class StepEnd:
    """The end of a run's traced step(s) and its report; `session` is the RunSession that traced them
    (its `traced` TraceSession, models, watches, surface), whose `report` and `note` this sets."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.reported: torch.nn.Module | None = None  # the model the report is about (the container of several)
        self.stopped: str | None = None  # where and why the trace ended before the step's end

    def finish(self, error: BaseException | None) -> Any:
        """End the trace: `error` is what ended the script during the traced step(s), if anything."""
        from dtype_doctor.machine.simulate import SimulationStop
        from dtype_doctor.run.step_watch import stopped_early
        from dtype_doctor.trace.engine import model_info

        s = self.session
        assert s.traced is not None and s.model is not None
        s.traced.stop()
        s.traced.recorder.resume_keeping(drop=s.failure is None)
        self.reported = s.models.root() if s.models.several else s.model
        if s.models.several:
            s.info = s.models.frozen(model_info(self.reported, None, s.alias))
        s.models.done()
        s.grads.disarm()
        if s.keep_running and not s.placement.simulated:
            s.disarm()  # the rest of the run goes at full speed
        failure = s.failure
        if isinstance(error, SimulationStop):
            failure = self._simulation_stop(error, failure)
        self.stopped = stopped_early(error, failure)
        if s.placement.simulated:  # the script's own error about a simulated tensor names the device it stands for
            from dtype_doctor.machine.wording import as_device

            self.stopped = as_device(self.stopped, device_name(s.surface.target))  # type: ignore[arg-type]
        report = self.report(failure)
        if failure is None and error is not None and not _the_doctors_stop(error):
            # Raised outside the model's forward (the loss, GradScaler, the optimizer; a time-out is the doctor's limit, said in
            # the coverage, never a DD001). When no error-level finding explains it, the step is not clean: the trace stopped early.
            if not report.at_or_above("error"):
                from dtype_doctor.records import TraceFailure
                from dtype_doctor.records.errors import first_line

                failure = TraceFailure("other", f"{type(error).__name__}: {first_line(error)}", "", type(s.model).__name__, None, "training step")
                report = self.report(failure)
        s.report = report
        if s.on_report is not None:
            with s.surface.disk_paused():
                s.on_report(report)  # the report file is the doctor's to write
        return report

    def _simulation_stop(self, error: Any, failure: Any) -> Any:
        """The simulation ended the script (a value asked of a fake tensor, a limit): its failure and note."""
        from dtype_doctor.records import TraceFailure

        s = self.session
        if error.limit is not None and failure is None:
            # A library op with a compiled kernel and no fake implementation, or a CUDA API call the
            # simulation does not answer: a limit of the simulation, named.
            failure = TraceFailure("simulation", f"{error.limit_said} (called at {error.where})", "",
                                   type(s.model).__name__, error.limit, "forward" if error.in_forward else "training step")
        elif error.in_forward and failure is None:
            failure = TraceFailure("simulation", f"fake tensors hold no values, and {error.where} asks for one ({error.what})",
                                   "", type(s.model).__name__, None)
        traced = f"{min(s.steps, s.max_steps)} of {s.max_steps} step(s) traced up to there, the script stopped"
        s.note = (f"the simulation ends at {error.where}: {error.what} needs a value, and simulated CUDA tensors "
                  f"hold none; {traced}")
        if error.limit is not None:
            s.note = f"the simulation ends at {error.where}: {error.limit_short}; {traced}"
        return failure

    def report(self, failure: Any) -> Any:
        """The report of the step(s) traced, ended by `failure` if anything."""
        from dtype_doctor.diagnosis import live_trace, report_from_trace
        from dtype_doctor.records import Subject
        from dtype_doctor.run.bindings import CallBindings
        from dtype_doctor.run.lineage import sources_of
        from dtype_doctor.trace.request import TraceRequest

        s = self.session
        assert s.traced is not None and s.model is not None
        trace = live_trace(s.traced, s.info, failure, lineage=s.lineage, sources=sources_of(s.lineage))
        if s.placement.simulated:
            trace = as_simulated(trace, s.placement, s.surface.target, s.model, s.surface.simulation, s.surface.disk)
        values = s.traced.recorder.values
        if values is not None and s.grads.handles:
            trace = dataclasses.replace(trace, grads=s.grads.stats(values), grad_scaler=bool(s.watch.scaler_calls))
        coverage = s.watch.coverage(trace, s.forwards, self.stopped)
        coverage = dataclasses.replace(coverage, compiled=s.compiles.regions(self.reported, {m.name for m in trace.modules}),
                                       skipped=tuple(s.models.repeats.items()), dropped_ops=s.traced.recorder.dropped,
                                       unwatched=s.joins.unwatched,
                                       not_simulated=s.surface.not_simulated())
        loaded = None if s.models.several else s.loads.facts_of(s.model)
        trace = dataclasses.replace(trace, coverage=coverage, scaler=s.watch.scaler_class(), scaler_off=s.watch.scaler_off,
                                    optimizers=s.watch.optimizer_groups(), loaded=loaded, precision=s.precision.state(),
                                    recompute=s.recompute.facts(), resume=s.resume.facts())
        if s.launch is not None:
            trace = launched(trace, s.launch)
        if s.trainer_args.launch is not None:  # the script's TrainingArguments: their precision and DeepSpeed config
            trace = dataclasses.replace(trace, launch=s.trainer_args.launch)
        request = TraceRequest(select=s.select, ignore=s.ignore, subject=Subject(model=s.label))
        report = report_from_trace(trace, self.reported, request)
        sources = FindingSources(self.reported, s.info, s.models, s.loads, s.conversions, s.created,
                                 s.handled, s.lineage, s.capture.bound if s.capture else CallBindings())
        findings = tuple(sources.placed(f) for f in report.findings)
        return dataclasses.replace(report, findings=findings, environment=s.surface.environment(dict(report.environment)),
                                   target=s.loads.with_component_loads(report.target, self.reported))


def _the_doctors_stop(error: BaseException) -> bool:
    """A stop that is the doctor's or the user's (StopScript, exit, ^C, --timeout), never the step's failure."""
    from dtype_doctor.machine.control import UserCodeTimeout
    from dtype_doctor.records.errors import StopScript

    return isinstance(error, (StopScript, SystemExit, KeyboardInterrupt, UserCodeTimeout))
