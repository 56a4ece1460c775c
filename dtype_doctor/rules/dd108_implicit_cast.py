"""DD108: the model silently casts one of its inputs to another floating dtype."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOAT8, Finding, Trace
from dtype_doctor.rules._common import base_op, cast_remedies, input_name, source_of, stage_of
from dtype_doctor.rules.base import Rule

CASTS = frozenset({"aten._to_copy", "aten.to", "aten._to_dtype"})


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[str] = set()
    for op in trace.ops:
        if op.phase != "forward" or op.autocast or base_op(op.op) not in CASTS or not op.outputs:
            continue
        src, out = op.operands[0], op.outputs[0]
        name = input_name(src)
        # Only the input itself (or a view of it): casts of activations are the model's business.
        if name is None or src.name != name or not (src.is_floating and out.is_floating) or src.dtype == out.dtype:
            continue
        if out.dtype in FLOAT8:
            continue  # an fp8 layer quantizes its input by design (DD506 judges its matmul): no pipeline's doing
        if name in seen:
            continue
        seen.add(name)
        yield RULE.finding(
            f"{op.module_type or 'the model'} casts input {name} from {src.dtype} to {out.dtype} itself",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage_of(trace, src),
            tensors=(src, out),
            source=source_of(trace, src),
            remedies=cast_remedies(trace, (src,), out.dtype),
        )


RULE = Rule(
    code="DD108",
    name="implicit-cast",
    severity="info",
    summary="The model silently casts an input to another dtype.",
    why=(
        "Models such as CLIP or ViT variants cast pixel_values to their weight dtype. It works, but the batch "
        "was built, stored and moved at the wrong precision: twice the memory and transfer for fp32 into fp16, "
        "lost precision for the reverse."
    ),
    example="fp32 pixel_values into an fp16 model that calls pixel_values.to(self.dtype)",
    fix="Produce the input in the model's dtype in the pipeline (cast-inputs).",
    fix_safety="cast-inputs is safe.",
    check=check,
)
