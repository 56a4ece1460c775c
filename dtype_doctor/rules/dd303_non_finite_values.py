"""DD303: NaN or Inf produced — the first module, in execution order, whose output has them
while its inputs were finite (what HF's DebugUnderflowOverflow finds by hand)."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FP16_MAX, Finding, ModuleCall, OpCall, Trace
from dtype_doctor.rules._common import base_op
from dtype_doctor.rules._numerics import escapes, keep_fp32_remedy, module_outputs, overflowed, span
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.values_measured:
        return
    outputs = module_outputs(trace)
    explained = {op.module for op in trace.ops if overflowed(op) and escapes(op, outputs, FP16_MAX)}  # DD301 names those
    first = next((m for m in trace.modules if m.phase == "forward" and _produced(m)), None)
    if first is not None:
        if not any(name == first.name or name.startswith(f"{first.name}.") or not first.name for name in explained):
            yield _module_finding(trace, first)
        return
    # Ops alone are not judged: model code makes -inf on purpose (masks, log of zero buckets)
    # and clamps or masks it before a module hands its output on.
    bad = [g for g in trace.grads if not g.stats.finite]
    if bad:
        yield RULE.finding(
            f"the backward made non-finite gradients for {len(bad)} parameter{'s' if len(bad) != 1 else ''} "
            f"(first: {bad[0].name}, {bad[0].dtype}) while the forward stayed finite",
            stage="optimizer",
        )


def _produced(m: ModuleCall) -> bool:
    return m.stats is not None and not m.stats.finite and (m.input_stats is None or m.input_stats.finite)


def _op_produced(op: OpCall) -> bool:
    """An op that turned finite floating operands into NaN/Inf (a constant fill has no operands)."""
    return op.stats is not None and not op.stats.finite and op.operand_stats is not None and op.operand_stats.finite


def _what(s) -> str:  # noqa: ANN001 - a ValueStats
    share = f"{s.nonfinite:.0%} of sampled values" if s.nonfinite else "values"
    return f"NaN/Inf ({share})"


def _module_finding(trace: Trace, m: ModuleCall) -> Finding:
    op = next(
        (op for op in trace.ops if op.phase == "forward" and op.module == m.name and _op_produced(op)),
        None,
    )
    where = f"; first op {base_op(op.op).removeprefix('aten.')}" if op is not None else ""
    half = bool(m.outputs) and m.outputs[0].dtype in ("float16", "bfloat16")
    return RULE.finding(
        f"{m.module_type or 'the model'} produced {_what(m.stats)} from finite inputs ({span(m.input_stats)}){where}",
        module=m.name,
        module_type=m.module_type,
        op=op.op if op is not None else None,
        tensors=m.outputs[:1],
        remedies=(keep_fp32_remedy(m.name),) if half else (),
    )


RULE = Rule(
    code="DD303",
    name="non-finite-values",
    severity="error",
    summary="NaN or Inf produced: names the first module (in execution order) whose output has them while its inputs were finite.",
    why=(
        "One NaN spreads through every later op, so a NaN loss says nothing about where it began. The first "
        "module that turns finite inputs into NaN/Inf is where to look: an fp16 overflow (DD301 names those), "
        "a log or sqrt of a value out of its domain, a division by a variance that underflowed to zero."
    ),
    example="encoder.layer.3.attention.self (BertSelfAttention) produced NaN/Inf (12% of sampled values) from finite inputs (|x| ≤ 3.1e+04)",
    fix="Keep that module in float32 (keep-fp32), or fix the op that leaves its domain (clamp, add an epsilon).",
    fix_safety="keep-fp32 is safe when the module's output is half precision.",
    check=check,
    device_note="Needs real values: a simulated trace has none, and the report says so.",
)
