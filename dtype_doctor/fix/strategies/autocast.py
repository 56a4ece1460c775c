"""autocast: trace under torch.autocast with the half dtype the mismatch involves; weights stay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy
from dtype_doctor.records import HALF, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Autocast(
    Strategy, name="autocast", applicability=SAFE, rank=30,
    summary="run the forward under torch.autocast in the half dtype the mismatch involves",
):
    def suggestion(self, to: str) -> str:
        return f"run the forward under torch.autocast(dtype=torch.{to}); weights stay as they are"

    def describe(self, c: Change) -> str:
        return f"run the forward under torch.autocast(dtype=torch.{c.to})"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if pipeline.autocast:
            raise Skip(f"the forward already runs under autocast ({pipeline.autocast})")
        halves = [r.to for r in self.remedies(report, ctx) if r.to in HALF]
        if not halves:
            raise Skip("no half-precision operand in the mismatches: autocast would not change them")
        return (Change(self.name, "forward", max(set(halves), key=halves.count), None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        return pipeline.with_(request=pipeline.request.with_(autocast=changes[0].to))

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        file = site.call if site.run else site.script
        if file is None:
            return []
        line = site.call_line if site.run else None
        return [Attempt(file, cm.WrapForwardInAutocast(device_type=site.device_type, dtype=c.to, line=line))]

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        parts.setdefault(self.name, {"dtype": c.to, "device_type": site.device_type})
