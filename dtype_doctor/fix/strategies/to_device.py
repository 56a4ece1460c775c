"""to-device: move stray inputs to the model's device."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import (
    SAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, factory_of, listed, one_attempt, resolve, said,
)
from dtype_doctor.records import Finding, Remedy, Report

if TYPE_CHECKING:
    import torch

    from dtype_doctor.fix.patches import Attempt


MODEL = "model"  # the remedy's target when the model, not the batch, is on the wrong device


class ToDevice(
    Strategy, name="to-device", applicability=SAFE, rank=10, json_kind="move-input",
    summary="move stray inputs to the model's device",
):
    moves_tensor = True

    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        to = remedies[0].to
        if any(r.target == MODEL for r in remedies):
            return f"move the model to {to}, the device the script put its batch on (never the batch off the GPU)"
        made = [said(r) for r in remedies if r.target.startswith("created:")]
        kept = [said(r) for r in remedies if r.target.startswith("attribute:")]
        moved = [said(r) for r in remedies if not r.target.startswith(("created:", "attribute:"))]
        words = [f"move {listed(moved)} to {to}, the model's device"] if moved else []
        words += [f"register {listed(kept)} as a buffer (register_buffer(name, tensor, persistent=False)): "
                  "model.to() moves buffers, never plain attributes"] if kept else []
        words += [f"create {listed(made)} on the model's device ({to}): pass device= the device of the tensors it meets"] if made else []
        return "; ".join(words)

    def describe(self, c: Change) -> str:
        if c.target == MODEL:
            return f"move the model to {c.to}, where the script put its batch"
        if c.target.startswith("attribute:"):
            return f"register {said(Remedy(self.name, c.target, c.to, c.stage, c.source))} as a buffer, so it moves to {c.to}"
        if c.target.startswith("created:"):
            made = said(Remedy(self.name, c.target, c.to, c.stage, c.source))
            return f"create {made} on {c.to}, not {c.before}" if c.before else f"create {made} on {c.to}"
        return f"move {c.target} {c.before} → {c.to}" if c.before else f"move {c.target} to {c.to}"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        from dtype_doctor.numerics import device_name

        remedies = self.remedies(report, ctx)
        if any(r.target == MODEL for r in remedies):
            raise Skip("the model is on the CPU and its batch on a GPU: the model moves (fix --run patches where the script builds it)")
        changes = [
            Change(self.name, r.target, r.to, device_name(pipeline.inputs[r.target].device), r.stage, r.source)
            for r in remedies
            if isinstance(pipeline.inputs.get(r.target), torch.Tensor)
        ]
        if not changes:
            code_made = sorted({r.target for r in remedies if r.target not in pipeline.inputs})
            reason = "the stray tensor is created in model code: " + ", ".join(code_made) if code_made else "no input is on another device"
            raise Skip(reason + "; it needs device= where it is created")
        return tuple({c.target: c for c in changes}.values())

    def script_changes(self, finding: Finding, remedies: Sequence[Remedy], report: Report, ctx: Context) -> tuple[Change, ...]:
        """As any strategy's; a model of several that moves carries the line that placed it (the finding's)."""
        changes = super().script_changes(finding, remedies, report, ctx)
        model = report.trace.model if report.trace is not None else None
        if model is None or not model.components:
            return changes
        # A weight of another model of the step (a text encoder left on the CPU, whose output reached the UNet):
        # that model moves, where the script placed it (the finding's line, the weights' conversion).
        moved = {(MODEL, c.to): dataclasses.replace(c, target=MODEL, placed=finding.source) for c in changes
                 if c.target == MODEL or (c.target.startswith("param:") and model.component_of(c.target[6:]))}
        return tuple(moved.values()) + tuple(c for c in changes if (MODEL, c.to) not in moved)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = _move(inputs[c.target], c.to, simulated=pipeline.simulate)
        return pipeline.with_(inputs=inputs)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        if not site.run:
            return one_attempt(site.script, [cm.MoveBatchToDevice()])
        if c.target == MODEL:
            # The model left on the CPU goes to the batch's device, as the script wrote it where it moved the batch.
            builders = (site.model_class, "from_pretrained") if site.model_class else ("from_pretrained",)
            moved_at = c.source.line if c.source else None
            placed = resolve(c.placed)
            attempts = [Attempt(placed, cm.MoveModelWherePlaced(c.placed.line, moved_at))] if placed and c.placed else []
            attempts += one_attempt(site.call, [cm.MoveModelToBatchDevice(site.call_line or 0, moved_at, builders)])
            batch = resolve(c.source)
            if batch is not None and c.source is not None:
                # The forward is the model's own (generate() calls it): the model moves where the script builds it.
                attempts += one_attempt(batch, [cm.MoveModelToBatchDevice(0, c.source.line, builders)])
            return attempts
        if c.target.startswith("created:"):
            # Made in the model's code without device=: device= where it is made, from what is in scope there.
            file = resolve(c.source)
            return [Attempt(file, cm.AddDevice(c.source.line, factory_of(c.target)[0]))] if file and c.source else []
        if c.target.startswith("attribute:"):  # a plain tensor attribute model.to() left behind: a buffer where it is assigned
            file = resolve(c.source)
            return [Attempt(file, cm.RegisterBuffer(c.source.line, c.target.rpartition(".")[2].removeprefix("attribute:")))] if file and c.source else []
        attempts = []
        handled = site.handled.get(c.target)
        if handled is not None and handled.origin is not None and (file := resolve(handled.origin)) is not None:
            # A slice of a tensor a function of the user's built and returned on the CPU: the move goes on its return.
            attempts.append(Attempt(file, cm.MoveWhereHandled(handled.origin.line)))
        if handled is not None and (file := resolve(handled.source)) is not None:
            # The move the script dropped belongs on the last line of its that handled the tensor.
            attempts.append(Attempt(file, cm.MoveWhereHandled(handled.source.line, handled.call)))
        if c.source is not None and (handled is None or c.source not in (handled.source, handled.origin)) and (file := resolve(c.source)) is not None:
            attempts.append(Attempt(file, cm.MoveWhereHandled(c.source.line)))
        return attempts + one_attempt(site.call, [cm.MoveBatchToDevice(variable=site.model_name, line=site.call_line)])

    fix_module = ModulePart(
        function="to_device",
        role="batch",
        order=30,
        why=(
            "Every tensor in the batch is moved to the device the model's weights are on, so no\n"
            "op sees operands on two devices."
        ),
        usage="batch = apply_fix(model, batch)\noutputs = model(**batch)",
        source='''

def to_device(model, batch):
    """Return a copy of `batch` with every tensor on {device_doc}."""
    device = {device_expr}
    return {{key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}}
''',
    )

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        parts.setdefault(self.name, {"device": c.to})

    def scan_options(self, params: Mapping[str, Any]) -> None:
        return None  # apply_fix moves the batch in the user's own loop, which scan does not run

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """``device`` (default: the model's device)."""
        import re

        device = params.get("device")
        if device is not None and not re.fullmatch(r"[a-z]+(:\d+)?", str(device)):
            raise Skip(f"bad device {device!r}")
        return {
            "device_doc": f'"{device}"' if device else "the model's device",
            "device_expr": f'torch.device("{device}")' if device else "_model_dtype_and_device(model)[1]",
        }


def _move(t: "torch.Tensor", device: str, *, simulated: bool) -> "torch.Tensor":
    """t on `device`; in a simulated pipeline a fake tensor there (the target may not exist)."""
    if not simulated:
        return t.to(device)
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from dtype_doctor.trace.engine import fake_like

    mode = t.fake_mode if isinstance(t, FakeTensor) else FakeTensorMode(allow_non_fake_inputs=True)
    return fake_like(mode, t, device)
