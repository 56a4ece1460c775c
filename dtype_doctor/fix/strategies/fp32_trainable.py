"""fp32-trainable: keep trainable parameters in float32 (master weights) for AMP + GradScaler."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt
from dtype_doctor.records import HALF, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Fp32Trainable(
    Strategy, name="fp32-trainable", applicability=SAFE, rank=40,
    summary="keep trainable parameters float32 (master weights) and run the forward under autocast",
):
    def suggestion(self, to: str) -> str:
        return "keep trainable parameters in float32 and run the forward under torch.autocast"

    def describe(self, c: Change) -> str:
        return f"keep the {c.target} parameters in float32 (were {c.before})"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if not self.relevant(report, ctx):
            raise Skip("no half-precision trainable parameters in a training trace")
        half = sorted({p.dtype for p in report.trace.model.parameters if p.requires_grad and p.dtype in HALF})
        changes = [Change(self.name, "trainable", "float32", ",".join(half))]
        if not pipeline.autocast:
            # fp32 trainable weights beside half frozen ones only meet cleanly under autocast.
            changes.append(Change("autocast", "forward", half[0] if half else "bfloat16", None))
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        model = copy.deepcopy(pipeline.model)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad and p.is_floating_point():
                    p.data = p.data.float()
        autocast = next((c.to for c in changes if c.kind == "autocast"), pipeline.autocast)
        return pipeline.with_(model=model, request=pipeline.request.with_(autocast=autocast))

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm

        # The script converted the whole (trainable) model to half: keep it as loaded.
        mods = [cm.RemoveModelConversion(from_dtype=d) for d in ("float16", "bfloat16")]
        if not site.run:
            return one_attempt(site.script, mods)
        where = site.conversion_file
        return [a for m in mods for a in one_attempt(where, [m])] + site.retarget_conversion(c)
