"""DD104: a loss target whose dtype the loss rejects or silently reinterprets."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOATING, INTEGER, Finding, OpCall, TensorMeta, Trace
from dtype_doctor.rules._common import CLASS_LOSS, VALUE_LOSS, base_op, cast_remedies, describe, refused, required_of, source_of, stage_of
from dtype_doctor.rules.base import Rule

def judge(op: OpCall) -> tuple[str, str, TensorMeta, str | None] | None:
    """(severity, message, target, advice beyond the cast) for a loss op, or None when the
    target is right. The cast itself is the finding's remedy: the dtype the loss needs."""
    family = base_op(op.op)
    targets = op.by_role("target")
    if not targets:
        return None
    target = targets[0]
    inputs = [t for t in op.operands if t.role == "input" and t.is_floating]
    pred = inputs[0] if inputs else None
    if family == "torch.nn.functional.cross_entropy":
        # Integer class indices are judged at nll_loss; a target shaped like the logits is
        # class probabilities, which must be floating.
        if pred is not None and target.shape == pred.shape and not target.is_floating:
            return ("error", f"class-probability target is {target.dtype}; cross_entropy needs floating probabilities (one-hot → .float())", target, None)
        return None
    if family in CLASS_LOSS:
        if target.dtype in ("int64", "uint8"):
            return None
        return ("error", f"class-index loss target is {target.dtype}; cross_entropy / nll_loss accept only int64 (or uint8)", target, None)
    if family in VALUE_LOSS and pred is not None:
        loss = family.removeprefix("aten.")
        if target.dtype in INTEGER or target.dtype == "bool":
            if "binary_cross_entropy" in family:
                return ("error", f"{loss} target is {target.dtype}; it needs a floating target of the prediction's dtype ({pred.dtype})", target, None)
            return ("warning", f"integer labels ({target.dtype}) reach {loss}: the model treats them as regression targets; check num_labels / problem_type", target,
                    "or set num_labels > 1 for classification")
        if target.dtype in FLOATING and target.dtype != pred.dtype:
            if op.error is not None:
                return ("error", f"{loss} target is {target.dtype} but the prediction is {pred.dtype}; this loss needs both in one dtype", target, None)
            return ("warning", f"{loss} target is {target.dtype} but the prediction is {pred.dtype}: the loss is silently computed in the wider dtype", target, None)
    return None


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple] = set()
    for op in trace.ops:
        if op.phase != "forward":
            continue
        verdict = judge(op)
        if verdict is None:
            continue
        severity, message, target, advice = verdict
        if severity == "error" and not refused(op):
            continue  # the kernel took it after all
        if refused(op):
            severity = "error"  # a target judged silent that this kernel refuses (BCE wants the input's dtype)
        key = (op.module, base_op(op.op), target.dtype)
        if key in seen:
            continue
        seen.add(key)
        required = required_of(op, target, None)
        yield RULE.finding(
            message.replace("target is", f"target {describe(target)} is", 1) if target.name else message,
            severity=severity,
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage_of(trace, target, rejected=lambda d: d != required),
            tensors=op.operands[:2],
            source=source_of(trace, target),
            pytorch_error=op.error,
            remedies=cast_remedies(trace, (target,), required),
            hints=(advice,) if advice else (),
        )


RULE = Rule(
    code="DD104",
    name="loss-target-dtype",
    severity="error",
    summary="A loss target whose dtype the loss rejects or silently reinterprets (int32 class labels, int multi-hot BCE targets, float64 regression targets, int labels routed to regression).",
    why=(
        "cross_entropy needs int64 class indices and raises on int32; BCE-with-logits raises on integer "
        "multi-hot targets; MSE accepts integer or float64 targets silently and computes in the wider dtype, "
        "which usually means the labels took the wrong route (num_labels=1 turns class labels into regression)."
    ),
    example=(
        "labels = torch.tensor(ds['label'], dtype=torch.int32)\n"
        "model(**batch, labels=labels)\n"
        "RuntimeError: expected target dtype to be Long or Byte, but got Int"
    ),
    fix="Cast class labels to int64 and regression / multi-label targets to the prediction's dtype (cast-inputs).",
    fix_safety="cast-inputs is safe. Silent cases are warnings.",
    check=check,
    rejects=lambda op: (v := judge(op)) is not None and v[0] == "error",
)
