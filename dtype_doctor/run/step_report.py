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
        if finding.source is not None or not self.models.several or not finding.module:
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
        sources = (self.conversions.source_for(self.reported, name, dtype=t.dtype) for t, name in held)
        # the load only for the finding's own weights: an input made from another model's weights is not theirs
        loads = (self._load_site(name, t.dtype) for t, name in held if t.role in ("weight", "bias", "buffer"))
        from dtype_doctor.run.bindings import dtype_decided_at

        source = next((s for s in sources if s is not None), None) or dtype_decided_at(next((s for s in loads if s is not None), None))
        return dataclasses.replace(finding, source=source) if source is not None else finding

    def _load_site(self, name: str, dtype: str) -> Any:
        """The user's from_pretrained line that loaded the model holding parameter `name` in `dtype`."""
        model = dict(self.reported.named_children()).get(name.split(".", 1)[0]) if self.models.several else self.reported
        return self.loads.site_of(model, dtype=dtype)
