"""The collator stage: the collator ``Trainer`` and the example scripts use by default for the
model's processing class — ``DataCollatorWithPadding`` for a tokenizer or a sequence feature
extractor (``run_audio_classification.py`` passes the feature extractor), the LM / seq2seq
collators for causal-LM and encoder-decoder text, else ``default_data_collator``; or, with
``--collator none``, the rows stacked as ``dataset[:n]`` hands them to a script. Speech-to-text
rows get the collator ``run_speech_recognition_seq2seq.py`` defines (not in the library)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from dtype_doctor.records.errors import InputError, first_line
from dtype_doctor.load.batch.describe import describe_value, value_step
from dtype_doctor.load.batch.processors.audio import AUDIO_INPUTS
from dtype_doctor.load.batch.processors.text import ensure_pad_token
from dtype_doctor.load.batch.state import BatchContext, BatchState


def _stack_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What `dataset[:n]` hands a script: each column stacked, dtypes as they are."""
    import torch

    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else torch.tensor(values)
    return out


@dataclass(frozen=True)
class SpeechSeq2SeqCollator:
    """``DataCollatorSpeechSeq2SeqWithPadding`` of ``run_speech_recognition_seq2seq.py``: the
    feature extractor pads the inputs, the tokenizer pads the labels (-100 where padded), and a
    leading decoder start token is dropped because the model prepends it again."""

    feature_extractor: Any
    tokenizer: Any
    decoder_start_token_id: int | None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        name = self.feature_extractor.model_input_names[0]
        batch = dict(self.feature_extractor.pad([{name: f[name]} for f in features], return_tensors="pt"))
        padded = self.tokenizer.pad([{"input_ids": f["labels"]} for f in features], return_tensors="pt")
        labels = padded["input_ids"].masked_fill(padded["attention_mask"].ne(1), -100)
        if self.decoder_start_token_id is not None and bool((labels[:, 0] == self.decoder_start_token_id).all()):
            labels = labels[:, 1:]
        batch["labels"] = labels
        return batch


def _choose(state: BatchState, ctx: BatchContext, lm_labels: bool) -> tuple[BatchState, Callable[..., Any], str]:
    import transformers
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

    keys = state.columns
    tokenizer, fe = ctx.tokenizer, ctx.feature_extractor
    if ctx.collator == "none":
        return state, _stack_rows, "no collator (rows stacked as dataset[:n])"
    if tokenizer is not None and "input_ids" in keys:
        state = ensure_pad_token(tokenizer, state)
        if lm_labels:
            return state, transformers.DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False), "DataCollatorForLanguageModeling"
        if ctx.encoder_decoder and "labels" in keys:
            # the seq2seq examples' collator: pads labels (with -100) as well as the inputs
            return state, transformers.DataCollatorForSeq2Seq(tokenizer), "DataCollatorForSeq2Seq"
        return state, transformers.DataCollatorWithPadding(tokenizer), "DataCollatorWithPadding"
    audio = isinstance(fe, SequenceFeatureExtractor) and any(k in keys for k in AUDIO_INPUTS)
    if audio and ctx.encoder_decoder and tokenizer is not None and "labels" in keys:
        start = getattr(ctx.loaded.config, "decoder_start_token_id", None)
        return state, SpeechSeq2SeqCollator(fe, tokenizer, start), "DataCollatorSpeechSeq2SeqWithPadding"
    if audio:
        return state, transformers.DataCollatorWithPadding(fe), "DataCollatorWithPadding"
    return state, transformers.default_data_collator, "default_data_collator"


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    assert state.rows is not None
    keys = state.columns
    has_labels = any(k in keys for k in ("label", "labels", "label_ids"))
    lm_labels = (
        ctx.collator != "none" and ctx.causal_lm and not has_labels and "input_ids" in keys and "labels" in ctx.forward
    )
    state, collate, name = _choose(state, ctx, lm_labels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Creating a tensor from a list of numpy.ndarrays is slow"
            batch = dict(collate([dict(r) for r in state.rows]))
    except Exception as e:
        raise InputError(
            f"{name} could not batch the rows: {type(e).__name__}: {first_line(e)}; "
            "pass --preprocess FILE.py:FUNC to give the columns one shape per row"
        ) from None
    if lm_labels and "labels" not in batch and "input_ids" in batch:
        # no tokenizer to run DataCollatorForLanguageModeling: do what it does
        batch["labels"] = batch["input_ids"].clone()
        state = state.note("no tokenizer: labels copied from input_ids as DataCollatorForLanguageModeling(mlm=False) does")
    lineage = state.lineage
    if "labels" in batch and "labels" not in lineage.steps:
        if "label" in lineage.steps:
            lineage = lineage.rename("label", "labels")
        elif "label_ids" in lineage.steps:
            lineage = lineage.rename("label_ids", "labels")
        elif lm_labels:
            lineage = lineage.copy("input_ids", "labels")
    state = state.but(lineage=lineage, collator=name, inputs=batch)
    for key, t in batch.items():
        state = state.step(key, value_step("collator", t, _detail(key, t, state, name, lm_labels, ctx)))
    return state


def _detail(key: str, t: Any, state: BatchState, name: str, lm_labels: bool, ctx: BatchContext) -> str:
    before = state.lineage.last(key)
    dt = describe_value(t)[0]
    if key == "labels" and lm_labels:
        return f"{name}(mlm=False) copies input_ids as labels (padding → -100)"
    if before is None:
        return f"{name} created it" + (" (tokenizer.pad)" if ctx.tokenizer is not None and key == "attention_mask" else "")
    if before.dtype is not None and before.dtype != dt:
        return f"{name} made it {dt} (was {before.dtype})"
    if before.dtype is None and dt is not None:
        return f"{name} made {'an' if dt.startswith('int') else 'a'} {dt} tensor from python values"
    return f"{name} {'stacked' if name == 'default_data_collator' else 'padded and stacked'} the rows"
