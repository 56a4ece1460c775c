"""grad-scaler: float16 autocast training gets its loss scaled (DD403).

A script whose step trains under float16 autocast with its GradScaler made disabled
(`GradScaler(enabled=False)`) flushes small gradients to zero and nothing raises. The change is
in the script's own line: the scaler the script already calls is switched on (codemods.scaler),
with the flag the script's float16 choice decides where the file names it. Nothing changes in
memory; `fix --run` verifies by running the script again, past the step to its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt, resolve
from dtype_doctor.records import Finding, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class GradScalerOn(
    Strategy, name="grad-scaler", applicability=SAFE, rank=14,
    summary="switch on the script's disabled GradScaler, so float16 autocast training scales its loss",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        lines = ", ".join(f"{r.source.file}:{r.source.line}" for r in remedies if r.source)
        return ("enable the GradScaler the script makes disabled: GradScaler(enabled=True) (or the float16 choice, "
                "enabled=(dtype == torch.float16))" + (f" at {lines}" if lines else ""))

    def describe(self, c: Change) -> str:
        where = f" at {c.source.file}:{c.source.line}" if c.source else ""
        return f"enable the GradScaler{where}"

    def plan(self, pipeline: Pipeline | None, report: Report, ctx: Context) -> tuple[Change, ...]:
        raise Skip("the GradScaler's calls are in the script's own loop: fix --run enables it there")

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        """Nothing in memory: the scaler is the script's, which the re-run runs."""
        return pipeline

    def script_changes(self, finding: Finding, remedies: Sequence[Remedy], report: Report, ctx: Context) -> tuple[Change, ...]:
        if not any(r.source is not None for r in remedies):
            raise Skip("the script makes no disabled GradScaler to switch on (adding one to its loop is left to you)")
        return super().script_changes(finding, remedies, report, ctx)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm

        file = resolve(c.source)
        return one_attempt(file, [cm.EnableGradScaler([c.source.line] if c.source else None)])
