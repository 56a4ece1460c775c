"""keep-fp32: keep the smallest set of modules float32 that makes the half model finite and
close to float32 (the search is dtype_doctor.fix.keep_fp32): on a float16 model whose findings
ask for it, or asked for by name on a float32 model, which it converts to float16 keeping that set.

It always lands in the fix module: keep_fp32(model) carries the module list and the
input-casting hooks, which no one-line edit of a script could.
"""

from __future__ import annotations

from typing import Any

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy
from dtype_doctor.records import HALF, Report

class KeepFp32(
    Strategy, name="keep-fp32", applicability=SAFE, rank=50, on_request=True,
    summary="keep the smallest set of modules float32 that makes the half model finite and close to float32",
):
    def suggestion(self, to: str) -> str:
        return "keep the smallest set of modules float32 that makes the half model finite (--strategy keep-fp32)"

    def describe(self, c: Change) -> str:
        if c.target != "model":
            return f"keep {c.target} float32 instead of {c.before}"
        return (
            (f"convert the model {c.before} → {c.to}" if c.before != c.to else f"keep the model {c.to}")
            + " except the modules kept float32 (and those it declares fp32); each module casts its inputs to its own dtype"
        )

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        if pipeline.simulate:
            raise Skip("finding the modules to keep needs real values; it does not run under --simulate")
        if pipeline.autocast:
            raise Skip(f"the forward runs under autocast ({pipeline.autocast}), which picks each op's dtype whatever the weights'")
        from dtype_doctor.numerics import main_dtype

        main = main_dtype(pipeline.model)
        if main not in HALF and ctx.requested != self.name:
            raise Skip(f"the model is {main}: nothing runs in half precision (--strategy keep-fp32 converts it to float16)")
        if main not in HALF and main != "float32":
            raise Skip(f"the model is {main}; keep-fp32 converts float32 models to float16")
        if main in HALF and not self.remedies(report, ctx) and ctx.requested != self.name:
            raise Skip("no finding asks for modules in float32")
        target = main if main in HALF else "float16"
        from dtype_doctor.fix.keep_fp32 import minimal_fp32_set

        found = minimal_fp32_set(pipeline.model, pipeline.inputs, dtype=getattr(torch, target))
        if not found.needed:
            raise Skip(found.reason)
        if not found.verified:
            raise Skip("no set of modules kept float32 works: " + found.reason)
        return (
            Change(self.name, "model", target, main),
            *(Change(self.name, name, "float32", target) for name in found.modules),
        )

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        from dtype_doctor.fix.keep_fp32 import apply_keep_fp32

        dtype = getattr(torch, next(c.to for c in changes if c.target == "model"))
        model = copy.deepcopy(pipeline.model)
        apply_keep_fp32(model, [c.target for c in changes if c.target != "model"], dtype)
        return pipeline.with_(model=model)

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        part = parts.setdefault(self.name, {"modules": []})
        if c.target == "model":
            part["dtype"] = c.to
        else:
            part["modules"].append(c.target)
