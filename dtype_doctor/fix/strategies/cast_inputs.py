"""cast-inputs: cast model inputs to the dtype the rules say their consumer needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import (
    SAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, at_source, identifier, inputs_cast, listed, made_in_model,
    one_attempt, resolve, said, set_literal,
)
from dtype_doctor.records import LABEL_KEYS, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class CastInputs(
    Strategy, name="cast-inputs", applicability=SAFE, rank=20, json_kind="cast-input",
    summary="cast the offending inputs where the pipeline makes them (no weight changes)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        casts = listed([f"{said(r)} to {r.to}{' (.long())' if r.to == 'int64' else ''}" for r in remedies])
        many = len({r.target for r in remedies}) > 1
        if any(made_in_model(r) for r in remedies):
            return f"cast {casts} where {'they are' if many else 'it is'} made"
        return f"cast {casts} where the pipeline produces {'them' if many else 'it'}"

    def describe(self, c: Change) -> str:
        target = said(Remedy(self.name, c.target, c.to, c.stage, c.source)) if c.target.startswith("created:") else c.target
        return f"cast {target} {c.before} → {c.to}" if c.before else f"cast {target} to {c.to}"

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
        return inputs_cast(pipeline, changes)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        if site.run:
            # fix --run: the cast on the line the lineage says made the dtype, then at the model call,
            # then a cast added on that line (where the dtype came through a variable, or the model is
            # called in more places than the first).
            attempts = at_source(c)
            if site.call is not None and c.target in site.step_inputs:
                if c.target in LABEL_KEYS and c.to == "int64":
                    attempts.append(Attempt(site.call, cm.LabelsToLong(key=c.target, variable=site.model_name, line=site.call_line)))
                else:
                    dtype = None if c.to == site.model_dtype else c.to
                    attempts.append(Attempt(site.call, cm.CastBatch(keys=(c.target,), dtype=dtype, variable=site.model_name,
                                                                          line=site.call_line, positions=dict(site.positions))))
            elif c.to == "int64" and site.script is not None:
                attempts.append(Attempt(site.script, cm.CastLabelsToLong()))
            if c.source is not None and (file := resolve(c.source)) is not None:
                attempts.append(Attempt(file, cm.CastWhereMade(c.source.line, c.to)))
            return attempts
        attempts = _preprocess_attempts(c, site)
        if c.target in LABEL_KEYS:
            mods = [cm.LabelsToLong(key=c.target)] if c.to == "int64" else [cm.CastBatch(keys=(c.target,), dtype=c.to)]
        else:
            # Casting to the model's own dtype reads best (and survives a later dtype change).
            mods = [cm.CastBatch(keys=(c.target,), dtype=None if c.to == site.model_dtype else c.to)]
        return attempts + one_attempt(site.script, mods)

    fix_module = ModulePart(
        function="cast_inputs",
        role="batch",
        order=40,
        why=(
            "Floating inputs are cast to the dtype of the model's weights, and integer index and\n"
            "label tensors to int64, the dtype embeddings and losses expect. The weights stay as\n"
            "they are, so nothing about the model's precision changes."
        ),
        usage="batch = apply_fix(model, batch)\noutputs = model(**batch)",
        source='''

# Inputs and the dtype each must have: the casts dtype-doctor applied and verified.
CASTS = {casts}
# Integer tensors the model uses as indices or class targets: made int64.
INDEX_KEYS = {index_keys}
# Floating tensors cast to the model's dtype; None: every floating tensor.
CAST_KEYS = {cast_keys}


def cast_inputs(model, batch):
    """Return a copy of `batch` with {cast_doc}."""
    dtype = {dtype_expr}
    fixed = dict(batch)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in CASTS:
            fixed[key] = value.to(CASTS[key])
        elif key in INDEX_KEYS and not value.is_floating_point() and value.dtype not in (torch.int64, torch.bool):
            fixed[key] = value.long()
        elif key in {{"input_ids", "token_type_ids", "position_ids"}} and value.is_floating_point():
            fixed[key] = value.long()
        elif value.is_floating_point() and (CAST_KEYS is None or key in CAST_KEYS):
            fixed[key] = value.to(dtype)
    return fixed
''',
    )
    # Without exact casts, the keys cast to int64 by rule of thumb.
    INDEX_KEYS = ("input_ids", "token_type_ids", "position_ids", "decoder_input_ids", "labels", "label", "label_ids")

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        casts = parts.setdefault(self.name, {"casts": {}})["casts"]
        # The function may return a label under the dataset's name; the collator renames it.
        for key in LABEL_KEYS if c.target in LABEL_KEYS else (c.target,):
            casts[key] = c.to

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """``casts`` ({key: dtype}, the casts to make), or ``dtype`` (default: the model's),
        ``keys`` (floating keys to cast; default all) and ``index_keys``."""
        from dtype_doctor.source.analysis import normalize_dtype

        casts = {identifier(str(k)): normalize_dtype(str(v)) for k, v in (params.get("casts") or {}).items()}
        dtype = normalize_dtype(params["dtype"]) if params.get("dtype") else None
        keys = [identifier(str(k)) for k in params.get("keys") or ()]
        # Given the exact casts, nothing else is touched; else rules of thumb for every input.
        index_keys = [identifier(str(k)) for k in params.get("index_keys") or (() if casts else self.INDEX_KEYS)]
        listed = ", ".join(f'"{k}": torch.{d}' for k, d in sorted(casts.items()))
        if casts and not keys and not index_keys:
            doc = "the inputs in CASTS in their dtype"
        else:
            doc = f"floating tensors in {f'torch.{dtype}' if dtype else 'the model dtype'} and index/label tensors int64"
        return {
            "casts": "{" + listed + "}",
            "index_keys": set_literal(index_keys) if index_keys else "set()",
            "cast_keys": set_literal(keys) if keys else ("set()" if casts else "None"),
            "cast_doc": doc,
            "dtype_expr": f"torch.{dtype}" if dtype else "_model_dtype_and_device(model)[0]",
        }

    def module_casts(self, params: Mapping[str, Any]) -> Mapping[str, str] | None:
        return params.get("casts") or None


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
