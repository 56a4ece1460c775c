"""grad-scaler: float16 autocast training gets its loss scaled (DD403).

A script whose step trains under float16 autocast with its GradScaler made disabled
(`GradScaler(enabled=False)`), or with none, flushes small gradients to zero and nothing raises.
The change is in the script's own lines (codemods.scaler): the scaler the script already calls is
switched on, with the flag the script's float16 choice decides where the file names it; with no
scaler, one is made after the optimizer and wraps the backward and the optimizer step. Nothing
changes in memory; `fix --run` verifies by running the script again, past the step to its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt, resolve
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class GradScalerOn(
    Strategy, name="grad-scaler", applicability=SAFE, rank=14,
    summary="switch on the script's disabled GradScaler (or add one to its loop), so float16 autocast training scales its loss",
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

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        """The disabled scaler enabled on the line that made it; with none, one added to the script's loop
        (after its optimizer is made, around its one backward and optimizer step)."""
        from dtype_doctor.fix import codemods as cm

        if c.source is not None:
            return one_attempt(resolve(c.source), [cm.EnableGradScaler([c.source.line])])
        return [a for f in site.user_files for a in one_attempt(f, [cm.AddGradScaler()])]
