"""Requested against actual precision (docs/report.md, `requested`): per model, what the user asked
for — from_pretrained's dtype, a quantization config, an attention implementation, autocast, a
launcher's mixed precision — beside what the step ran, and each fallback with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.lowbit import Fallback
from dtype_doctor.records.trace import Trace

LAUNCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True, slots=True)
class Requested:
    """One setting of one model: asked, ran, and the fallback between them (None: it ran as asked)."""

    model: str
    setting: str  # dtype | quantization | attention | autocast | mixed_precision
    requested: str
    actual: str
    fallback: Fallback | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "setting": self.setting, "requested": self.requested, "actual": self.actual,
                "fallback": self.fallback.to_dict() if self.fallback is not None else None}


def _forward_autocast(trace: Trace) -> str | None:
    """The autocast dtype most forward ops ran under, None when none ran under autocast."""
    seen = [op.autocast for op in trace.ops if op.phase == "forward" and op.autocast]
    return max(set(seen), key=seen.count) if seen else None


def _dtype_row(trace: Trace, model: str) -> Requested | None:
    loaded, actual = trace.loaded, trace.model.main_dtype
    if loaded is None or actual is None:
        return None
    asked = loaded.asked or f"auto (from the {loaded.origin}: {loaded.dtype})"
    return Requested(model, "dtype", asked, actual)


def _quantization_row(trace: Trace, model: str) -> Requested | None:
    low = trace.loaded.lowbit if trace.loaded is not None else None
    if low is not None and low.method is not None:
        fb = low.fallback
        if fb is not None and trace.train:
            fb = Fallback(fb.setting, fb.requested, fb.actual, fb.reason, fb.mirrors, changes_training=True)
        actual = fb.actual if fb is not None else ("bfloat16 (dequantize=True asked)" if low.dequantized else low.method)
        return Requested(model, "quantization", low.method, actual, fb)
    q = trace.model.quantization
    if q is not None:
        return Requested(model, "quantization", q.method, f"{q.method}, compute {q.compute_dtype or 'the input dtype'}")
    return None


def _attention_row(trace: Trace, model: str) -> Requested | None:
    """The implementation asked for and the one the model's config holds. Where the doctor traced
    another in its place (flash-attn cannot run on this machine) that is the trace's stand-in, not a
    fallback of the user's run: said in `actual`, no fallback."""
    loaded = trace.loaded
    asked = loaded.attn_implementation if loaded is not None else None
    if asked is None:
        return None
    if loaded.attn_traced_as and loaded.attn_traced_as != asked:
        return Requested(model, "attention", asked, f"{asked} (traced as {loaded.attn_traced_as}: it cannot run on this machine)")
    ran = trace.model.attn_implementation or asked
    fb = None
    if ran != asked:
        fb = Fallback("attention", asked, ran, f"transformers set the model's attention to {ran}",
                      "the model's config._attn_implementation after loading")
    return Requested(model, "attention", asked, ran, fb)


def _autocast_rows(trace: Trace, model: str) -> list[Requested]:
    rows, ran = [], _forward_autocast(trace)
    forward = any(op.phase == "forward" for op in trace.ops)
    wanted = []
    if trace.autocast not in (None, "off"):
        wanted.append(("autocast", f"autocast({trace.autocast})", False))
    mp = trace.launch.mixed_precision if trace.launch is not None else None
    if mp in LAUNCH_DTYPES:
        wanted.append(("mixed_precision", f"launcher mixed_precision={mp}", True))
    for setting, asked, may_cast_model in wanted:
        fb = None
        # a launcher that casts the model instead (DeepSpeed's bf16) runs no autocast and is no fallback
        if forward and ran is None and (not may_cast_model or trace.model.main_dtype == "float32"):
            fb = Fallback(setting, asked, "no autocast", f"no forward op of the step ran under autocast on {trace.device}",
                          "the traced ops' autocast state", changes_training=trace.train)
        rows.append(Requested(model, setting, asked, f"autocast({ran})" if ran else "no autocast", fb))
    return rows


def requested_of(trace: Trace) -> tuple[Requested, ...]:
    """The settings the step's model was asked for, each beside what ran."""
    model = trace.model.class_name
    rows = [_dtype_row(trace, model), _quantization_row(trace, model), _attention_row(trace, model)]
    return tuple(r for r in rows if r is not None) + tuple(_autocast_rows(trace, model))
