"""DD301: values beyond float16's range — forecast from an fp32/bf16 trace, seen in an fp16
one, or a constant too large for the half tensor it is written into."""

from __future__ import annotations

import math
from typing import Iterator

from dtype_doctor.records import DTYPE_MAX, FP16_MAX, Finding, OpCall, Trace
from dtype_doctor.rules._common import base_op, keep_fp32
from dtype_doctor.rules._numerics import (
    FORECAST_MARGIN,
    computes_in_fp16,
    escapes,
    keep_fp32_remedy,
    module_outputs,
    overflowed,
    span,
    value,
)
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import classify_error

# Ops that write a given number into a tensor; the number's magnitude is the user's constant.
WRITES = frozenset(
    {
        "aten.fill", "aten.fill_", "aten.masked_fill", "aten.masked_fill_", "aten.full", "aten.full_like",
        "aten.new_full", "aten.scalar_tensor", "aten.index_fill", "aten.index_fill_", "aten.clamp",
        "aten.clamp_", "aten.where", "torch.Tensor.__setitem__",
    }
)


def check(trace: Trace) -> Iterator[Finding]:
    yield from _constants(trace)
    if not trace.values_measured:
        return
    if computes_in_fp16(trace):
        yield from _overflows(trace)
    else:
        yield from _forecast(trace)


def written_dtype(op: OpCall) -> str | None:
    """The dtype a constant is written into: the output's, else the tensor written to."""
    for t in (*op.outputs, *op.operands):
        if t.is_floating and not t.is_scalar:
            return t.dtype
    return op.outputs[0].dtype if op.outputs else None


def _constants(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple] = set()
    for op in trace.ops:
        raised = op.error is not None and classify_error(op.error, op.operands) == "overflow"
        if not raised and base_op(op.op) not in WRITES:
            continue
        dtype = written_dtype(op)
        limit = DTYPE_MAX.get(dtype or "")
        big = [c for c in op.attr("constants", ()) if limit is not None and abs(c) > limit]
        if not big and not raised:
            continue
        key = (op.module, dtype, big[0] if big else base_op(op.op))  # setitem's number and its aten fill alike
        if key in seen:
            continue
        seen.add(key)
        shown = value(big[0]) if big else "a number"
        what = "PyTorch refuses it" if raised else f"it silently becomes {'-' if big and big[0] < 0 else ''}inf"
        yield RULE.finding(
            f"{base_op(op.op).removeprefix('aten.')} writes {shown} into a {dtype} tensor, beyond its largest value "
            f"{value(limit or 0)}: {what}",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage="model-code",
            tensors=tuple(t for t in op.operands if not t.is_scalar)[:2],
            pytorch_error=op.error if raised else None,
        )


def _by_module(ops: list[OpCall]) -> dict[str, OpCall]:
    """The worst op (largest output) of each module, in order of first appearance."""
    worst: dict[str, OpCall] = {}
    for op in ops:
        have = worst.get(op.module)
        if have is None or _absmax(op) > _absmax(have):
            worst[op.module] = op
    return worst


def _absmax(op: OpCall) -> float:
    return op.stats.absmax if op.stats is not None and not math.isnan(op.stats.absmax) else math.inf


def _overflows(trace: Trace) -> Iterator[Finding]:
    outputs = module_outputs(trace)
    hit = [op for op in trace.ops if overflowed(op) and escapes(op, outputs, FP16_MAX)]
    for module, op in _by_module(hit).items():
        yield _at_module(module, op, f"overflowed float16: finite inputs ({span(op.operand_stats)}) gave inf")


def _at_module(module: str, op: OpCall, what: str, severity: str | None = None) -> Finding:
    """A finding at the module whose op made the value, with keep-fp32 as its remedy."""
    return RULE.finding(
        f"{base_op(op.op).removeprefix('aten.')} in {op.module_type or 'the model'} {what}",
        severity=severity,
        module=module,
        module_type=op.module_type,
        op=op.op,
        tensors=tuple(t for t in op.operands if not t.is_scalar)[:2],
        remedies=(keep_fp32_remedy(module),),
    )


def made_here(op: OpCall) -> bool:
    """The op produced a larger magnitude than any operand had: the value was computed, not carried."""
    s, o = op.stats, op.operand_stats
    return s is not None and o is not None and math.isfinite(s.absmax) and s.absmax > o.absmax


def _forecast(trace: Trace) -> Iterator[Finding]:
    threshold = FP16_MAX / FORECAST_MARGIN
    outputs = module_outputs(trace)
    risky = [
        op
        for op in trace.ops
        if op.phase == "forward"
        and made_here(op)
        and op.stats.absmax >= threshold  # type: ignore[union-attr]
        and base_op(op.op) not in WRITES
        and not op.attr("fp32_kept")
        and escapes(op, outputs, threshold)
    ]
    converted = [op for op in risky if not keep_fp32(trace, op.module)]
    for module, op in _by_module(converted).items():
        peak = op.stats.absmax  # type: ignore[union-attr]
        beyond = peak > FP16_MAX
        where = trace.autocast or (op.outputs[0].dtype if op.outputs else "this trace")
        limit = "beyond float16's 65504, inf once converted" if beyond else f"within {FORECAST_MARGIN:g}× of float16's 65504"
        yield _at_module(module, op, f"reaches |x| = {value(peak)} in {where}: {limit}", "warning" if beyond else "info")
    # A module the model declares fp32 overflows only where the conversion ignores that
    # declaration: from_pretrained(dtype=float16) keeps it, model.half() converts it.
    kept = [op for op in risky if keep_fp32(trace, op.module) and op.stats.absmax > FP16_MAX]  # type: ignore[union-attr]
    for module, op in _by_module(kept).items():
        where = trace.autocast or (op.outputs[0].dtype if op.outputs else "this trace")
        yield _at_module(
            module, op,
            f"reaches |x| = {value(op.stats.absmax)} in {where}, beyond float16's 65504. from_pretrained(dtype=torch.float16) "  # type: ignore[union-attr]
            "keeps this module in float32 (_keep_in_fp32_modules), but model.half() and .to(torch.float16) convert it: "
            "inf there",
            "warning",
        )


RULE = Rule(
    code="DD301",
    name="fp16-overflow-risk",
    severity="error",
    summary="Values beyond float16's range (65504): forecast from an fp32/bf16 trace, seen as inf in an fp16 one, or a constant too large for the half tensor it is written into.",
    why=(
        "float16's largest value is 65504. Activations that pass it (T5-style FFN outputs, long residual "
        "streams) become inf after .half() or under fp16 autocast, and inf turns into NaN in the next "
        "softmax or norm. Constants such as -1e10 or torch.finfo(torch.float32).min written into an fp16 "
        "tensor either make PyTorch refuse (masked_fill, full, fill_) or silently become inf (indexing "
        "assignment, where). Nothing raises for most of these, which is why they are feared."
    ),
    example=(
        "scores = scores.masked_fill(mask, -1e10)   # scores float16\n"
        "RuntimeError: value cannot be converted to type c10::Half without overflow\n\n"
        "fp32 trace: addmm in encoder.block.1.layer.1.DenseReluDense.wo reaches |x| = 7.1e+04 (> 65504)"
    ),
    fix=(
        "Keep the overflowing modules in float32 (keep-fp32 finds the smallest set and writes it), use "
        "bfloat16, or write torch.finfo(tensor.dtype).min instead of a fixed constant."
    ),
    fix_safety="keep-fp32 is safe (it only raises precision); constants are display-only.",
    check=check,
    device_note=(
        "Value statistics come from real tensors; a simulated trace has none and only reports constants. "
        f"A forecast flags values from 65504/{FORECAST_MARGIN:g} up (info) and beyond 65504 (warning). A module the "
        "model keeps in fp32 is flagged only beyond 65504, naming the conversions that ignore the declaration "
        "(model.half(), .to(float16)); what flows from it until a converted module is not flagged."
    ),
)
