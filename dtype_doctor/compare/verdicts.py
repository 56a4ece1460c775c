"""A row's one-line verdict and the table's recommendation: pure functions of the measurements."""

from __future__ import annotations

import math
from typing import Iterable

from dtype_doctor.compare.records import COSINE_MIN, REFERENCE, Recommendation, Row
from dtype_doctor.report.common import byte_size

QUESTION = "autocast or .half()?"


def verdict(row: Row) -> str:
    """reference | ok | inaccurate | overflows: needs keep-fp32 | training step fails | fails, joined by '; '.

    "ok" is finite, accurate and one GradScaler step works (here and on CUDA)."""
    v = row.variant
    if row.failure:
        return "fails"
    if v.name == REFERENCE:
        return "reference"
    problems = []
    if not row.finite:
        # fp16 weights: the fix is modules kept in fp32 (the last row finds them).
        problems.append("overflows: needs keep-fp32" if v.weights == "float16" and not v.keep_fp32 else "overflows")
    elif not row.accurate:
        problems.append("inaccurate")
    step = row.train_step
    if step is not None and not step.ok:
        problems.append("training step fails")
    elif step is not None and step.cuda_ok is False:
        problems.append("training step fails on CUDA")
    return "; ".join(problems) or "ok"


def _peak(row: Row) -> int:
    return row.peak_bytes if row.peak_bytes is not None else row.weight_bytes


def _rank(row: Row) -> tuple[float, float, float]:
    """Least peak memory, then least weight memory, then the smaller error: never the timing,
    which a busy machine reorders from run to run."""
    return (_peak(row), row.weight_bytes, row.output.max_rel if row.output else math.inf)


def recommend(rows: Iterable[Row]) -> Recommendation:
    """The row with the least peak memory that is finite, accurate (cosine ≥ COSINE_MIN) and
    trains (a quantized row never does: its weights are frozen); beside it the pick for inference
    alone when that is another row (a quantized one included)."""
    usable = [r for r in rows if r.variant.name != REFERENCE and r.finite and r.accurate]
    # A quantized row's Linear weights are frozen (bitsandbytes stores no gradient for them): it is
    # a pick for inference, or the base of adapters, never the model to train.
    best = min((r for r in usable if r.trains and not r.variant.quantize), key=_rank, default=None)
    inference = min(usable, key=_rank, default=None)
    criteria = f"finite, accurate (cosine ≥ {COSINE_MIN:g}) and train"
    if best is None:
        line = f"fp32: no other row is {criteria.replace('train', 'trains')}"
    else:
        line = f"{best.variant.label}: the least peak memory ({byte_size(_peak(best))}) of the rows that are {criteria}"
    if inference is not None and inference is not best:
        line += f"; for inference alone: {inference.variant.label} ({byte_size(_peak(inference))} peak)"
    return Recommendation(
        question=QUESTION,
        row=best.variant.name if best else None,
        line=line,
        inference_row=inference.variant.name if inference is not None and inference is not best else None,
    )
