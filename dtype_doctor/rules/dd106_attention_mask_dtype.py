"""DD106: an attention mask whose dtype the attention kernel rejects or that differs from the query."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, OpCall, Trace
from dtype_doctor.ops.operands import required_dtype
from dtype_doctor.rules._common import ATTENTION, base_op, cast_remedies, describe, kernel_dtype, refused, source_of, stage_of
from dtype_doctor.rules.base import Rule


def mask_rejected(op: OpCall) -> bool:
    """SDPA raises unless the mask is bool, float32 or the query's dtype."""
    if base_op(op.op) not in ATTENTION:
        return False
    masks = op.by_role("mask")
    queries = [t for t in op.operands if t.role != "mask"]
    if not masks or not queries:
        return False
    # Under autocast the mask is cast with q/k/v, unless it is float64 or not floating.
    return kernel_dtype(op, masks[0]) not in ("bool", "float32", kernel_dtype(op, queries[0]))


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple] = set()
    for op in trace.ops:
        if op.phase != "forward" or base_op(op.op) not in ATTENTION:
            continue
        masks = op.by_role("mask")
        queries = [t for t in op.operands if t.role != "mask"]
        if not masks or not queries:
            continue
        mask, query = masks[0], queries[0]
        if kernel_dtype(op, mask) in ("bool", kernel_dtype(op, query)):
            continue
        rejected = mask_rejected(op)
        if rejected and not refused(op):
            continue  # the kernel took it: not an error, and not the silent upcast either
        if not rejected and op.autocast:
            continue  # autocast casts a floating mask with q/k/v
        key = (op.module, mask.dtype, query.dtype)
        if key in seen:
            continue
        seen.add(key)
        if rejected:
            message = f"attention mask {describe(mask)} is {mask.dtype}; SDPA accepts bool, float32 or the query dtype ({query.dtype})"
        else:
            message = f"attention mask is float32 but the query is {query.dtype}: the mask is upcast on every call"
        wanted = required_dtype("mask", mask.dtype, anchor=None, query=query.dtype)
        yield RULE.finding(
            message,
            severity="error" if rejected else "warning",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage_of(trace, mask, rejected=lambda d: d not in ("bool", query.dtype)),
            tensors=(query, mask),
            source=source_of(trace, mask),
            pytorch_error=op.error,
            remedies=cast_remedies(trace, (mask,), wanted, lambda d: d not in ("bool", query.dtype)),
            hints=("or pass a bool mask" if wanted != "bool" else f"or pass an additive mask in {query.dtype}",),
        )


RULE = Rule(
    code="DD106",
    name="attention-mask-dtype",
    severity="error",
    summary="An attention mask whose dtype the attention kernel rejects or that differs from the query dtype.",
    why=(
        "scaled_dot_product_attention takes a bool mask or an additive float mask; an int64 padding mask "
        "passed straight to it raises, and an fp16 mask with fp32 queries raises too. Hugging Face models "
        "convert their own 2-D int masks before attention, so those are not reported."
    ),
    example=(
        "F.scaled_dot_product_attention(q, k, v, attn_mask=batch['attention_mask'][:, None, None, :])\n"
        "RuntimeError: Expected attn_mask dtype to be bool or float or to match query dtype"
    ),
    fix="Pass mask.bool() (True = attend), or an additive mask in the query's dtype (cast-inputs).",
    fix_safety="cast-inputs is safe.",
    check=check,
    rejects=mask_rejected,
    device_note="PyTorch applies the same mask dtype check on CPU and CUDA.",
)
