"""to-device: move stray inputs to the model's device."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt
from dtype_doctor.records import Report

if TYPE_CHECKING:
    import torch

    from dtype_doctor.fix.patches import Attempt


class ToDevice(
    Strategy, name="to-device", applicability=SAFE, rank=10,
    summary="move stray inputs to the model's device",
):
    def suggestion(self, to: str) -> str:
        return f"move the tensor to {to}, the model's device"

    def describe(self, c: Change) -> str:
        return f"move {c.target} {c.before} → {c.to}"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        from dtype_doctor.numerics import device_name

        remedies = self.remedies(report, ctx)
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

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = _move(inputs[c.target], c.to, simulated=pipeline.simulate)
        return pipeline.with_(inputs=inputs)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm

        if site.run:
            return one_attempt(site.call, [cm.MoveBatchToDevice(line=site.call_line)])
        return one_attempt(site.script, [cm.MoveBatchToDevice()])

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        parts.setdefault(self.name, {"device": c.to})


def _move(t: "torch.Tensor", device: str, *, simulated: bool) -> "torch.Tensor":
    """t on `device`; in a simulated pipeline a fake tensor there (the target may not exist)."""
    if not simulated:
        return t.to(device)
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from dtype_doctor.trace.engine import fake_like

    mode = t.fake_mode if isinstance(t, FakeTensor) else FakeTensorMode(allow_non_fake_inputs=True)
    return fake_like(mode, t, device)
