"""tf32-new-api: the script's TF32 switches set and read through one API, fp32_precision.

PyTorch refuses to read a TF32 switch through the legacy API (allow_tf32,
get_float32_matmul_precision) once the new one (fp32_precision) set it (DD114), and recommends
the new one. The change is in the script's own lines: its legacy setters and reads rewritten
(codemods.tf32). Nothing changes in memory; `fix --run` verifies by running the script again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt, resolve
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Tf32NewApi(
    Strategy, name="tf32-new-api", applicability=SAFE, rank=19,
    summary="set and read the TF32 switches through fp32_precision alone, not allow_tf32 (the two APIs mixed raise)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        lines = ", ".join(f"{r.source.file}:{r.source.line}" for r in remedies if r.source)
        return ("move the TF32 lines to fp32_precision: torch.backends.cuda.matmul.fp32_precision = \"tf32\" for "
                "matmul.allow_tf32 = True, torch.backends.cudnn.conv.fp32_precision / rnn.fp32_precision for cudnn.allow_tf32"
                + (f" (at {lines})" if lines else ""))

    def describe(self, c: Change) -> str:
        where = f" at {c.source.file}:{c.source.line}" if c.source else ""
        return f"move {c.target}{where} to the fp32_precision API"

    def plan(self, pipeline: Pipeline | None, report: Report, ctx: Context) -> tuple[Change, ...]:
        remedies = self.remedies(report, ctx)
        if not remedies:
            raise Skip("no TF32 line of the script mixes the two APIs")
        return tuple({(r.target, r.source): Change(self.name, r.target, r.to, "legacy", r.stage, r.source) for r in remedies}.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        """Nothing in memory: the switches are set by the script's lines, which the re-run runs."""
        return pipeline

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm

        files = dict.fromkeys(f for f in (resolve(c.source), *site.user_files) if f is not None)
        return [a for f in files for a in one_attempt(f, [cm.Tf32ToNewApi()])]
