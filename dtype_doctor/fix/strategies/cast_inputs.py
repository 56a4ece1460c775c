"""cast-inputs: cast model inputs to the dtype the rules say their consumer needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, at_source, one_attempt
from dtype_doctor.records import LABEL_KEYS, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class CastInputs(
    Strategy, name="cast-inputs", applicability=SAFE, rank=20,
    summary="cast the offending inputs where the pipeline makes them (no weight changes)",
):
    def suggestion(self, to: str) -> str:
        return f"cast the input to {to} where the pipeline produces it"

    def describe(self, c: Change) -> str:
        return f"cast {c.target} {c.before} → {c.to}"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        from dtype_doctor.numerics import dtype_name

        wanted: dict[str, Remedy] = {}
        for r in self.remedies(report, ctx):
            if isinstance(pipeline.inputs.get(r.target), torch.Tensor):
                wanted.setdefault(r.target, r)
        changes = []
        for name, r in wanted.items():
            current = dtype_name(pipeline.inputs[name].dtype)
            if current != r.to:
                changes.append(Change(self.name, name, r.to, current, r.stage, r.source))
        if not changes:
            made = sorted({r.target for r in self.remedies(report, ctx) if r.target not in pipeline.inputs})
            where = f": made in model code by {', '.join(made)}" if made else " (it comes from model code or weights)"
            raise Skip("no model input carries the offending dtype" + where)
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import torch

        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = inputs[c.target].to(getattr(torch, c.to))
        return pipeline.with_(inputs=inputs)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        if site.run:
            # fix --run: where the lineage says the dtype was made, then at the model call.
            attempts = at_source(c)
            if site.call is not None and c.target in site.step_inputs:
                if c.target in LABEL_KEYS and c.to == "int64":
                    attempts.append(Attempt(site.call, cm.LabelsToLong(key=c.target, line=site.call_line)))
                else:
                    dtype = None if c.to == site.model_dtype else c.to
                    attempts.append(Attempt(site.call, cm.CastBatch(keys=(c.target,), dtype=dtype, line=site.call_line, positions=dict(site.positions))))
            elif c.to == "int64" and site.script is not None:
                attempts.append(Attempt(site.script, cm.CastLabelsToLong()))
            return attempts
        attempts = _preprocess_attempts(c, site)
        if c.target in LABEL_KEYS:
            mods = [cm.LabelsToLong(key=c.target)] if c.to == "int64" else [cm.CastBatch(keys=(c.target,), dtype=c.to)]
        else:
            # Casting to the model's own dtype reads best (and survives a later dtype change).
            mods = [cm.CastBatch(keys=(c.target,), dtype=None if c.to == site.model_dtype else c.to)]
        return attempts + one_attempt(site.script, mods)

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        casts = parts.setdefault(self.name, {"casts": {}})["casts"]
        # The function may return a label under the dataset's name; the collator renames it.
        for key in LABEL_KEYS if c.target in LABEL_KEYS else (c.target,):
            casts[key] = c.to


def _preprocess_attempts(c: Change, site: Site) -> list["Attempt"]:
    """The cast in the --preprocess function: at the lineage's line, any cast building the
    value, or at every return. Only for a value that passes through the function and a dtype
    that survives to the model (see fix/patches.py)."""
    from pathlib import Path

    from dtype_doctor.fix import codemods as cm
    from dtype_doctor.fix.patches import Attempt

    code = site.code
    file, func = (code.preprocess_file, code.preprocess_function) if code else (None, None)
    if code is None or file is None or func is None:
        return []
    if not code.passes_through(c.target) or not code.survives_preprocess(c.to):
        return []
    attempts = []
    if c.source is not None and Path(c.source.file).resolve() == file:
        attempts.append(Attempt(file, cm.RetargetCast(func, c.to, key=c.target, lines=[c.source.line])))
    attempts.append(Attempt(file, cm.RetargetCast(func, c.to, key=c.target)))
    attempts.append(Attempt(file, cm.CastReturnedValue(func, c.target, c.to)))
    return attempts
