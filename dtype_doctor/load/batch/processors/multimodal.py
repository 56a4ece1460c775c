"""Text and images together → the model's processor (CLIP-style), called once for both as the
model docs call it: ``processor(text=…, images=…)``, its own padding default (none: the
collator pads each batch)."""

from __future__ import annotations

from typing import Any

from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.describe import feature_repr
from dtype_doctor.load.batch.hf_map import map_processor
from dtype_doctor.load.batch.processors.base import Modality, record_outputs
from dtype_doctor.load.batch.processors.image import rgb_images
from dtype_doctor.load.batch.processors.text import ensure_pad_token
from dtype_doctor.load.batch.state import BatchContext, BatchState


def _columns(state: BatchState) -> tuple[str | None, str | None]:
    return columns.text_columns(state.dataset.features, set())[0], columns.image_column(state.dataset)


def applies(state: BatchState, ctx: BatchContext) -> bool:
    proc = ctx.loaded.processor
    if proc is None or getattr(proc, "tokenizer", None) is None or getattr(proc, "image_processor", None) is None:
        return False
    if not {"input_ids", "pixel_values"} <= ctx.forward or {"input_ids", "pixel_values"} & set(state.columns):
        return False
    return None not in _columns(state)


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    text, image = _columns(state)
    assert text is not None and image is not None
    proc = ctx.loaded.processor
    state = ensure_pad_token(proc.tokenizer, state)

    def process(batch: dict[str, list[Any]]) -> dict[str, Any]:
        return dict(proc(text=batch[text], images=rgb_images(batch[image], ctx.loaded)))

    before = set(state.columns)
    name = type(proc).__name__
    new = map_processor(state.dataset, process, "multimodal", f"{name} could not process columns '{text}', '{image}'")
    made = {c: (image if c == "pixel_values" else text) for c in new.column_names if c not in before}

    def detail(out: str, _dt: str | None) -> str:
        return f"{name}(text=<{text}>, images=<{image}>) → stored by datasets.map as {feature_repr(new.features[out])}"

    return record_outputs(state, new, made, detail)


MODALITY = Modality("multimodal", applies, run)
