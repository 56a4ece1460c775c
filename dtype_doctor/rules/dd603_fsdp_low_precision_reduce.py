"""DD603: gradients reduced across ranks in float16/bfloat16."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule
from dtype_doctor.ops.families import is_reduction

HALF = ("float16", "bfloat16")


def check(trace: Trace) -> Iterator[Finding]:
    if trace.world is None or trace.world.size < 2:
        return
    seen: set[str] = set()
    for op in trace.ops:
        if not is_reduction(op.op) or not op.operands:  # the root unit reduces in a callback after the backward
            continue
        dtype = op.operands[0].dtype
        if dtype not in HALF or dtype in seen:
            continue
        seen.add(dtype)
        count = sum(1 for o in trace.ops if is_reduction(o.op) and o.operands and o.operands[0].dtype == dtype)
        yield RULE.finding(
            f"gradients are reduced across {trace.world.size} ranks in {dtype} ({count} {op.op.split('.')[1]} calls): "
            f"each sum of {trace.world.size} partial gradients rounds to {dtype}'s "
            f"{'8' if dtype == 'bfloat16' else '11'}-bit mantissa",
            op=op.op,
            stage="optimizer",
            tensors=op.operands[:1],
            hints=("MixedPrecisionPolicy(param_dtype=..., reduce_dtype=torch.float32)",),
        )


RULE = Rule(
    code="DD603",
    name="fsdp-low-precision-reduce",
    severity="warning",
    summary="Gradients reduce-scattered (or all-reduced) across ranks in float16/bfloat16: reduce_dtype unset or half.",
    why=(
        "FSDP reduces gradients in reduce_dtype, which defaults to param_dtype: with param_dtype=bfloat16 every "
        "reduce-scatter sums the ranks' gradients in bfloat16. The error grows with the world size; small updates "
        "vanish before the optimizer sees them."
    ),
    example=(
        "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))  # reduce_dtype=None\n"
        "# backward: c10d._reduce_scatter_base_ on bfloat16 gradients"
    ),
    fix="Set MixedPrecisionPolicy(reduce_dtype=torch.float32) (FSDP1: MixedPrecision(reduce_dtype=torch.float32)).",
    fix_safety="display-only: the policy is in your launch code.",
    check=check,
    device_note="Judged from the collectives the traced step issued on the fake process group; the dtype is the one NCCL would get.",
)
