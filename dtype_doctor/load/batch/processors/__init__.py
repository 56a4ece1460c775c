"""The processor stage: raw columns (text, images, audio) through the model's own processor,
one module per modality, as a batched ``Dataset.map``. In transform mode the user's transform is
the whole pipeline, so nothing runs here."""

from __future__ import annotations

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
