"""Which dataset column plays which role (text, text pair, target text, image, audio, label),
found the way the Hugging Face example scripts name them."""

from __future__ import annotations

from typing import Any

TEXT_COLUMNS = ("text", "sentence", "content", "source", "document", "prompt", "question", "input", "review")
TEXT_PAIRS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"), ("question", "sentence"))
TARGET_TEXT_COLUMNS = ("target", "summary", "labels", "label", "translation", "output", "answer")
LABEL_COLUMNS = ("label", "labels", "target", "score", "label_ids")
AUDIO_COLUMNS = ("audio", "speech", "input_values")


def is_string(feat: Any) -> bool:
    import datasets

    return isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")


def _is_float_list(feat: Any) -> bool:
    import datasets

    inner = getattr(feat, "feature", None)
    return (
        inner is not None
        and isinstance(inner, datasets.Value)
        and inner.dtype in ("float16", "float32", "float64", "float", "double")
    )


def text_columns(features: Any, exclude: set[str]) -> tuple[str | None, str | None]:
    """(text column, its pair column or None)."""
    strings = [c for c, f in features.items() if is_string(f) and c not in exclude]
    for a, b in TEXT_PAIRS:
        if a in strings and b in strings:
            return a, b
    for c in TEXT_COLUMNS:
        if c in strings:
            return c, None
    return (strings[0], None) if strings else (None, None)


def target_text_column(features: Any) -> str | None:
    return next((c for c in TARGET_TEXT_COLUMNS if c in features and is_string(features[c])), None)


def image_column(ds: Any) -> str | None:
    import datasets

    for c, f in ds.features.items():
        if isinstance(f, datasets.Image):
            return c
    if len(ds):
        row = ds[0]
        for c in ds.column_names:
            if type(row.get(c)).__module__.startswith("PIL"):
                return c
    return None


def audio_column(ds: Any, forward: frozenset[str]) -> str | None:
    import datasets

    for c, f in ds.features.items():
        if isinstance(f, datasets.Audio):
            return c
    for c in AUDIO_COLUMNS:
        if c in ds.features and (_is_float_list(ds.features[c]) or isinstance(ds.features[c], dict)):
            if c == "input_values" and "input_values" in forward and "sampling_rate" not in ds.column_names:
                continue  # already model input, stored as such
            return c
    return None


def label_column(features: Any, causal_lm: bool) -> str | None:
    import datasets

    for c in LABEL_COLUMNS:
        if c not in features:
            continue
        f = features[c]
        if is_string(f):
            continue
        is_seq = getattr(f, "feature", None) is not None and not isinstance(f, datasets.ClassLabel)
        if causal_lm and not is_seq:
            continue  # a class label cannot be a causal LM's token labels
        return c
    return None
