"""Audio → the feature extractor, called as ``run_audio_classification.py`` and
``run_speech_recognition_seq2seq.py`` call it inside ``Dataset.map``:
``feature_extractor(arrays, sampling_rate=…)`` with the extractor's own padding default — none
for wav2vec2 (the collator pads each batch), ``"max_length"`` = 30 s = 3000 frames for Whisper,
which its encoder requires. For a speech-to-text model (encoder-decoder) the transcript column
becomes labels as that script makes them: ``tokenizer(text).input_ids``."""

from __future__ import annotations

from typing import Any

from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.describe import describe_value, feature_repr
from dtype_doctor.load.batch.hf_map import map_processor
from dtype_doctor.load.batch.processors.base import Modality, record_outputs, require
from dtype_doctor.load.batch.state import BatchContext, BatchState

AUDIO_INPUTS = ("input_values", "input_features")


def applies(state: BatchState, ctx: BatchContext) -> bool:
    wanted = {k for k in AUDIO_INPUTS if k in ctx.forward}
    if not wanted:
        return False
    column = columns.audio_column(state.dataset, ctx.forward)
    return column is not None and not ((wanted & set(state.columns)) - {column})


def _arrays(batch: dict[str, list[Any]], column: str) -> tuple[list[Any], list[Any]]:
    """(waveforms, their sampling rates) from datasets Audio cells or float lists."""
    import numpy as np

    arrays, rates = [], []
    for i, a in enumerate(batch[column]):
        if isinstance(a, dict):  # a decoded datasets Audio cell
            arrays.append(np.asarray(a["array"]))
            rates.append(a.get("sampling_rate"))
        else:
            arrays.append(np.asarray(a))
            rates.append(batch["sampling_rate"][i] if "sampling_rate" in batch else None)
    return arrays, rates


def transcript_column(state: BatchState, ctx: BatchContext, audio: str) -> str | None:
    if not (ctx.encoder_decoder and "labels" in ctx.forward) or "labels" in state.columns:
        return None
    return columns.text_columns(state.dataset.features, {audio})[0]


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    column = columns.audio_column(state.dataset, ctx.forward)
    assert column is not None
    fe = require(ctx.feature_extractor, column, "holds audio", ctx.loaded, "feature extractor", "preprocessor_config.json")
    transcript = transcript_column(state, ctx, column)
    tokenizer = None
    if transcript is not None:
        tokenizer = require(ctx.tokenizer, transcript, "is a transcript", ctx.loaded, "tokenizer", "tokenizer.json")
    seen: dict[str, Any] = {}

    def extract(batch: dict[str, list[Any]]) -> dict[str, Any]:
        arrays, rates = _arrays(batch, column)
        rate = next((r for r in rates if r), getattr(fe, "sampling_rate", None))
        out = dict(fe(arrays, sampling_rate=rate))
        if not seen:
            seen.update(out, _rate=rate)
        if transcript is not None:
            out["labels"] = tokenizer(batch[transcript]).input_ids
        return out

    before = set(state.columns)
    name = type(fe).__name__
    new = map_processor(state.dataset, extract, "audio", f"{name} could not process column '{column}'")
    made = {c: column for c in new.column_names if c not in before or (c == column and c in seen)}
    if transcript is not None:
        made["labels"] = transcript

    def detail(out: str, dt: str | None) -> str:
        if out == "labels" and transcript is not None:
            return f"{type(tokenizer).__name__}(<{transcript}>).input_ids → stored by datasets.map as {feature_repr(new.features[out])}"
        got = seen.get(out)
        inner = describe_value(got[0] if isinstance(got, list) and got else got)
        shape = f" {inner[1]}" if inner[1] else ""
        return (
            f"{name}(sampling_rate={seen.get('_rate')}) returned {inner[3]}{shape} per row; "
            f"stored by datasets.map as {dt}"
        )

    return record_outputs(state, new, made, detail)


MODALITY = Modality("audio", applies, run)
