"""bnb-fp32-cpu-offload: let a bitsandbytes model's device map offload, keeping the offloaded modules float32.

transformers refuses to load a bitsandbytes model whose device map puts modules on cpu/disk
beside others unless the BitsAndBytesConfig sets `llm_int8_enable_fp32_cpu_offload=True`
(DD505). The change is that one keyword of the user's BitsAndBytesConfig(...) call; there is no
model to change in memory (the load was refused), so the fix is verified by loading again:
`fix --run` runs the patched script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy
from dtype_doctor.fix.strategies.bnb_config import config_edits
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt

KEYWORD = "llm_int8_enable_fp32_cpu_offload"


class BnbFp32CpuOffload(
    Strategy, name="bnb-fp32-cpu-offload", applicability=SAFE, rank=17,
    summary="keep the modules a bitsandbytes model's device map offloads in float32 (llm_int8_enable_fp32_cpu_offload=True)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        return f"BitsAndBytesConfig({KEYWORD}=True): the modules the device map offloads to cpu/disk stay float32"

    def describe(self, c: Change) -> str:
        return f"set {KEYWORD}={c.to} in BitsAndBytesConfig"

    def plan(self, pipeline: Pipeline | None, report: Report, ctx: Context) -> tuple[Change, ...]:
        if not self.remedies(report, ctx):
            raise Skip("no device map offloads a quantized model without the flag")
        return (Change(self.name, "model", "True", "False"),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        """Nothing in memory: the flag decides how the model loads, and the load is re-run from the user's code."""
        return pipeline

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        return config_edits(KEYWORD, c, site)
