"""The formatter stage: what a DataLoader over the dataset reads. Labels under the names the
collators know, ``Trainer``'s ``remove_unused_columns``, then the rows through the dataset's
format (``with_format("torch")`` casts float16/float64 columns to float32 and int32 to int64);
in transform mode the user's transform was the formatter and the rows are already read."""

from __future__ import annotations

from typing import Any

from dtype_doctor.records.errors import InputError
from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.describe import describe_value
from dtype_doctor.load.batch.state import LABEL_NAMES, BatchContext, BatchState
from dtype_doctor.records import LineageStep

# forward parameters that are switches, not inputs: not named when the dataset gives none
_SWITCHES = ("labels", "return_dict", "use_cache", "output_attentions", "output_hidden_states")
_FORMATTER_CLASS = {"torch": "TorchFormatter", "numpy": "NumpyFormatter"}


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    state = _labels(state, ctx)
    state = _remove_unused_columns(state, ctx)
    if state.rows is not None:
        return state
    ds, fmt = state.dataset, ctx.dataset_format
    if fmt == "python":
        return state.but(rows=tuple(ds[i] for i in range(len(ds))), formatter="python")
    fds = ds.with_format(fmt)
    idx = list(range(len(ds)))
    rows = tuple(dict(r) for r in (fds.__getitems__(idx) if hasattr(fds, "__getitems__") else [fds[i] for i in idx]))
    state = state.but(rows=rows, formatter=fmt)
    for key in rows[0] if rows else ():
        before = state.lineage.last(key)
        dt, shape, dev, words = describe_value(rows[0][key])
        if before is not None and before.dtype and dt and before.dtype != dt:
            kind = "floating" if before.dtype.startswith(("float", "bfloat")) else "integer"
            detail = f"datasets {_FORMATTER_CLASS[fmt]} turns {kind} columns into {dt} ({before.dtype} → {dt})"
        else:
            detail = f"datasets {_FORMATTER_CLASS[fmt]} gave a {words}"
        state = state.step(key, LineageStep("formatter", dt, dev, shape, detail))
    return state


def _rename(state: BatchState, src: str, dst: str) -> BatchState:
    if state.rows is not None:
        rows = tuple({(dst if k == src else k): v for k, v in r.items()} for r in state.rows)
        return state.but(rows=rows, lineage=state.lineage.rename(src, dst))
    return state.but(dataset=state.dataset.rename_column(src, dst), lineage=state.lineage.rename(src, dst))


def _labels(state: BatchState, ctx: BatchContext) -> BatchState:
    """A 'target' or 'score' column passed as labels, which the collators and the loss read."""
    if "labels" not in ctx.forward:
        return state
    if state.rows is None:
        label = columns.label_column(state.dataset.features, ctx.causal_lm)
        state = state.but(label_column=label)
        if label in ("target", "score") and "labels" not in state.columns:
            state = _rename(state, label, "labels").but(label_column="labels")
            return state.note(f"column '{label}' passed as labels (Trainer would drop it: forward has no '{label}')")
        return state
    first = state.rows[0] if state.rows else {}
    if "labels" in first or "label" in first:
        return state
    for col in ("target", "score"):
        if col in first and not isinstance(first[col], str):
            return _rename(state, col, "labels").note(f"column '{col}' passed as labels")
    return state


def _remove_unused_columns(state: BatchState, ctx: BatchContext) -> BatchState:
    keep = set(ctx.forward) | ({"label", "label_ids"} if "labels" in ctx.forward else set())
    if ctx.causal_lm and state.rows is None:
        # only token labels fit a causal LM; without them the LM collator copies input_ids
        keep -= {c for c in LABEL_NAMES if c != state.label_column}
    present = state.columns
    dropped = [c for c in present if c not in keep]
    remaining = [c for c in present if c in keep]
    if not [c for c in remaining if c not in LABEL_NAMES]:
        shown = state.original_columns if ctx.preprocess is None else present
        accepted = [p for p in ctx.loaded.forward_params if p not in _SWITCHES]
        raise InputError(
            f"dataset columns [{_short(shown)}] give no input that {ctx.loaded.class_name}.forward accepts "
            f"({_short(accepted, 6)}); pass --preprocess FILE.py:FUNC"
        )
    shown_dropped = tuple(
        c for c in dropped if c in state.original_columns or (ctx.preprocess is not None and c not in state.made_by_processor)
    )
    state = state.but(dropped_columns=shown_dropped, lineage=state.lineage.keep(remaining))
    if state.rows is not None:
        return state.but(rows=tuple({k: v for k, v in r.items() if k in keep} for r in state.rows))
    return state.but(dataset=state.dataset.remove_columns(dropped)) if dropped else state


def _short(names: Any, limit: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", …" if len(names) > limit else "")
