"""cast-component: cast one component of a diffusers pipeline to the dtype the others hand it (DD801)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, listed
from dtype_doctor.records import HALF, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class CastComponent(
    Strategy, name="cast-component", applicability=SAFE, rank=12,
    summary="cast one component of a diffusers pipeline to the pipeline's dtype (pipe.unet.to(dtype))",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        casts = listed([f"pipe.{r.target}.to(torch.{r.to})" for r in remedies])
        return f"cast the component to the pipeline's dtype after loading it: {casts}"

    def describe(self, c: Change) -> str:
        return f"cast pipe.{c.target} {c.before} → {c.to}" if c.before else f"cast pipe.{c.target} to {c.to}"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if getattr(pipeline.model, "pipeline", None) is None:
            raise Skip("not a diffusers pipeline")
        dtypes = {c["name"]: c["dtype"] for c in report.target.components or ()}
        changes, lowered = {}, []
        for r in self.remedies(report, ctx):
            before = dtypes.get(r.target)
            if r.target not in dtypes or before == r.to:
                continue
            if before == "float32" and r.to in HALF and not (ctx.unsafe or ctx.requested == self.name):
                lowered.append(f"{r.target} {before} → {r.to}")
                continue
            changes.setdefault(r.target, Change(self.name, r.target, r.to, before, r.stage))
        if not changes:
            why = f"casting {listed(lowered)} lowers its precision; pass --strategy {self.name}" if lowered else \
                "every component named is already in the dtype asked for"
            raise Skip(why)
        return tuple(changes.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        container = pipeline.model
        for c in changes:
            module = copy.deepcopy(getattr(container.pipeline, c.target))
            container = container.with_component(c.target, module.to(getattr(torch, c.to)))
        return pipeline.with_(model=container)

    def pipeline_lines(self, c: Change) -> list[str]:
        return [f"{{pipe}}.{c.target}.to(torch.{c.to})  # dtype-doctor: one dtype for the components that meet"]

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        return component_edit(self, c, site)


def component_edit(strategy: Strategy, c: Change, site: Site) -> list["Attempt"]:
    """The strategy's lines for `c`, where the user's script sets its pipeline up (before its first call)."""
    from dtype_doctor.fix import codemods as cm
    from dtype_doctor.fix.patches import Attempt

    file = site.script
    return [Attempt(file, cm.SetUpPipeline(tuple(strategy.pipeline_lines(c))))] if file is not None else []
