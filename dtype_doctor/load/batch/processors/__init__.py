"""The processor stage: raw columns (text, images, audio) through the model's own processor,
one module per modality, as a batched ``Dataset.map``. In transform mode the user's transform is
the whole pipeline, so nothing runs here."""

from __future__ import annotations

from typing import Any

from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.processors import audio, image, multimodal, text
from dtype_doctor.load.batch.processors.base import Modality
from dtype_doctor.load.batch.state import BatchContext, BatchState

# multimodal first: a processor that takes text and images together is called once for both
MODALITIES: tuple[Modality, ...] = (multimodal.MODALITY, text.MODALITY, image.MODALITY, audio.MODALITY)


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    if state.rows is not None:
        return state
    for modality in MODALITIES:
        if modality.applies(state, ctx):
            state = modality.run(state, ctx)
    return state


def processor_call(dataset: Any, loaded: Any, *, max_length: int = 128) -> dict[str, Any] | None:
    """How this stage calls the model's processor on raw `dataset` rows, for a fix that makes
    the same call itself (the fix module's datasets transform): ``{"kind": "image" | "audio" |
    "text", "column": …}`` with the call's options; None when it is not one plain call (no raw
    column, several modalities, a text pair, seq2seq targets)."""
    state = BatchState(dataset=dataset, original_columns=tuple(dataset.column_names))
    ctx = BatchContext(loaded=loaded, max_length=max_length)
    found = [m.name for m in MODALITIES if m.applies(state, ctx)]
    if found == ["image"]:
        return {"kind": "image", "column": columns.image_column(dataset), "rgb": image.wants_rgb(loaded)}
    if found == ["audio"]:
        column = columns.audio_column(dataset, ctx.forward)
        return {"kind": "audio", "column": column} if audio.transcript_column(state, ctx, column) is None else None
    if found == ["text"] and ctx.tokenizer is not None:
        column, pair, target = text.input_columns(state, ctx)
        if pair is None and target is None:
            return {"kind": "text", "column": column, "max_length": text.call_kwargs(ctx.tokenizer, ctx).get("max_length")}
    return None
