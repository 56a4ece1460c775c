"""Build the model's inputs from dataset rows the way a Hugging Face training pipeline does, as
one list of typed stages that map and transform modes share:

    dataset → preprocess → processor → formatter → collator → transfer

Each stage is ``run(BatchState, BatchContext) -> BatchState``; every input's dtype is recorded
at each stage it passes (its *lineage*), so a report can say where a wrong dtype came from.
Processors and collators are the model's own, called as the Hugging Face example scripts and
``Trainer`` call them, with their own defaults: the traced batch is the user's batch.
"""

from __future__ import annotations

from typing import Any, Callable

from dtype_doctor.records.errors import UsageError
from dtype_doctor.load.batch import collator, dataset, formatter, preprocess, processors, transfer
from dtype_doctor.load.batch.describe import value_step
from dtype_doctor.load.batch.preprocess import load_preprocess
from dtype_doctor.load.batch.state import (
    COLLATORS,
    DATASET_FORMATS,
    PREPROCESS_MODES,
    Batch,
    BatchContext,
    BatchState,
    PreprocessFn,
)

__all__ = [
    "Batch", "BatchContext", "BatchState", "PreprocessFn", "STAGES", "build_batch", "load_preprocess",
    "PREPROCESS_MODES", "DATASET_FORMATS", "COLLATORS",
]

Stage = Callable[[BatchState, BatchContext], BatchState]
STAGES: tuple[tuple[str, Stage], ...] = (
    ("dataset", dataset.run),
    ("preprocess", preprocess.run),
    ("processor", processors.run),
    ("formatter", formatter.run),
    ("collator", collator.run),
    ("transfer", transfer.run),
)


def build_batch(
    loaded: Any,
    rows: Any,
    *,
    preprocess: str | None = None,
    preprocess_mode: str = "map",
    dataset_format: str = "torch",
    device: str = "cpu",
    max_length: int = 128,
    collator: str = "auto",
    timeout: float | None = None,
) -> Batch:
    """Turn `rows` (a ``LoadedRows``) into ``model(**inputs)`` keyword inputs for `loaded`.

    `preprocess` is "FILE.py:FUNC" (the user's map function); `preprocess_mode` "map" runs it
    through ``Dataset.map`` (outputs stored in Arrow, then the formatter), "transform" through
    ``Dataset.with_transform`` (outputs reach the collator as returned). `dataset_format` is the
    ``with_format`` type ("torch", "numpy", or "python" for none). `collator` "auto" batches the
    rows with the collator Trainer uses by default; "none" stacks them as ``dataset[:n]`` would.
    `timeout` limits the user's preprocess code (seconds; None or 0: no limit).
    `max_length` bounds truncation only for a tokenizer that knows no limit of its own. Raises
    ``InputError`` when the rows give nothing the model's forward accepts or a user function fails.
    """
    if preprocess_mode not in PREPROCESS_MODES:
        raise UsageError(f"preprocess mode {preprocess_mode!r} is not one of {', '.join(PREPROCESS_MODES)}")
    if dataset_format not in DATASET_FORMATS:
        raise UsageError(f"dataset format {dataset_format!r} is not one of {', '.join(DATASET_FORMATS)}")
    if collator not in COLLATORS:
        raise UsageError(f"unknown --collator {collator!r}; choose one of: {', '.join(COLLATORS)}")
    ctx = BatchContext(
        loaded=loaded,
        preprocess=load_preprocess(preprocess, timeout) if preprocess else None,
        preprocess_mode=preprocess_mode,
        dataset_format=dataset_format,
        device=device,
        max_length=max_length,
        collator=collator,
        timeout=timeout,
    )
    state = BatchState(dataset=rows.dataset, original_columns=tuple(rows.dataset.column_names))
    for _name, stage in STAGES:
        state = stage(state, ctx)
    return _batch(state, ctx, preprocess)


def _batch(state: BatchState, ctx: BatchContext, preprocess: str | None) -> Batch:
    """The model boundary: the last lineage step of every input, and the finished record."""
    inputs = dict(state.inputs or {})
    # a simulated input's fake lives where machine.home puts it; the lineage names the device asked for
    asked = ctx.device if getattr(ctx.loaded, "fake_mode", None) is not None else None
    for key, t in inputs.items():
        at = asked if asked is not None and getattr(t, "device", None) is not None and t.device.type != "cpu" else None
        state = state.step(key, value_step("model-boundary", t, f"{ctx.loaded.class_name}.forward({key}=…)", device=at))
    sources = dict(state.sources)
    if "labels" in inputs and "labels" not in sources:
        alias = next((a for a in ("label", "label_ids", "target", "score") if a in sources), None)
        if alias is not None:
            sources["labels"] = sources[alias]
    return Batch(
        inputs=inputs,
        lineage={k: tuple(state.lineage.steps.get(k, ())) for k in inputs},
        sources={k: v for k, v in sources.items() if k in inputs},
        dropped_columns=state.dropped_columns,
        collator=state.collator,
        formatter=state.formatter,
        preprocess=preprocess,
        preprocess_fn=ctx.preprocess,
        preprocess_mode=ctx.preprocess_mode,
        device=asked or next((str(t.device) for t in inputs.values() if hasattr(t, "device")), ctx.device),
        notes=state.notes,
    )
