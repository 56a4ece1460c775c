"""Raw text → the tokenizer, called as the Hugging Face task guides and example scripts call it
inside ``Dataset.map``: ``tokenizer(text[, pair], truncation=True)`` with no padding (the
collator pads each batch), and for an encoder-decoder ``tokenizer(text_target=…)`` for labels
(``run_summarization.py`` / ``run_translation.py``; ``DataCollatorForSeq2Seq`` pads them with -100)."""

from __future__ import annotations

from typing import Any

from dtype_doctor.records.errors import InputError
from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.describe import feature_repr
from dtype_doctor.load.batch.hf_map import map_processor
from dtype_doctor.load.batch.processors.base import Modality, record_outputs, require
from dtype_doctor.load.batch.state import BatchContext, BatchState

# a tokenizer that knows no model_max_length reports this (transformers' VERY_LARGE_INTEGER)
_NO_LIMIT = 10**12


def _target_column(state: BatchState, ctx: BatchContext) -> str | None:
    if ctx.encoder_decoder and "labels" in ctx.forward:
        return columns.target_text_column(state.dataset.features)
    return None


def input_columns(state: BatchState, ctx: BatchContext) -> tuple[str | None, str | None, str | None]:
    target = _target_column(state, ctx)
    text, pair = columns.text_columns(state.dataset.features, {target} if target else set())
    return text, pair, target


def applies(state: BatchState, ctx: BatchContext) -> bool:
    cols = set(state.columns)
    return "input_ids" in ctx.forward and not ({"input_ids", "inputs_embeds"} & cols) and input_columns(state, ctx)[0] is not None


def ensure_pad_token(tokenizer: Any, state: BatchState) -> BatchState:
    """As the HF examples do for a tokenizer without a pad token: pad with its eos token."""
    if tokenizer.pad_token is not None:
        return state
    if tokenizer.eos_token is None:
        raise InputError(
            "the tokenizer of this model has neither a pad token nor an eos token, so rows cannot be padded; "
            "pass --batch-size 1 or --preprocess FILE.py:FUNC"
        )
    tokenizer.pad_token = tokenizer.eos_token
    return state.note("tokenizer has no pad token: using its eos token, as the HF examples do")


def call_kwargs(tokenizer: Any, ctx: BatchContext) -> dict[str, Any]:
    """truncation=True to the tokenizer's own limit; only a tokenizer that knows none gets --max-length."""
    if getattr(tokenizer, "model_max_length", _NO_LIMIT) >= _NO_LIMIT:
        return {"truncation": True, "max_length": ctx.max_length}
    return {"truncation": True}


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    text, pair, target = input_columns(state, ctx)
    assert text is not None
    tokenizer = require(ctx.tokenizer, text, "is raw text", ctx.loaded, "tokenizer", "tokenizer.json / tokenizer_config.json")
    state = ensure_pad_token(tokenizer, state)
    kwargs = call_kwargs(tokenizer, ctx)

    def tokenize(batch: dict[str, list[Any]]) -> dict[str, Any]:
        enc = dict(tokenizer(batch[text], *([batch[pair]] if pair else []), **kwargs))
        if target is not None:
            enc["labels"] = tokenizer(text_target=batch[target], **kwargs)["input_ids"]
        return enc

    before = set(state.columns)
    name = type(tokenizer).__name__
    new = map_processor(state.dataset, tokenize, "tokenize", f"{name} could not tokenize column '{text}'")
    made = {c: text for c in new.column_names if c not in before}
    if target is not None:
        made["labels"] = target
    shown = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def detail(out: str, _dt: str | None) -> str:
        call = f"text_target=<{target}>, {shown}" if out == "labels" and target else shown
        return f"{name}({call}) → stored by datasets.map as {feature_repr(new.features[out])}"

    state = record_outputs(state, new, made, detail)
    if target is not None and target != "labels":
        state = state.but(dataset=state.dataset.remove_columns([target]), lineage=state.lineage.keep(
            c for c in state.lineage.steps if c != target))
    return state


MODALITY = Modality("text", applies, run)
