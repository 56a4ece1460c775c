"""DD602: fully_shard with cast_forward_inputs=False and floating inputs not in param_dtype."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules._common import cast_remedies
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    for g in trace.shards:
        if g.param_dtype is None or g.cast_forward_inputs:
            continue
        call = next((m for m in trace.modules if m.name == g.module and m.phase == "forward"), None)
        inputs = call.inputs if call is not None else (trace.inputs if not g.module else ())
        off = [t for t in inputs if t.dtype.startswith(("float", "bfloat")) and t.dtype != g.param_dtype]
        if not off:
            continue
        names = ", ".join(sorted({t.name or t.role for t in off}))
        yield RULE.finding(
            f"fully_shard({g.module or 'the model'}) gathers its weights in {g.param_dtype} but leaves its inputs as they come "
            f"(cast_forward_inputs=False): {names} arrive{'s' if len(off) == 1 else ''} as {off[0].dtype} and meet {g.param_dtype} weights",
            module=g.module,
            module_type=trace.model.module_type(g.module),
            stage="model-boundary" if not g.module else "model-code",
            tensors=tuple(off[:4]),
            remedies=tuple(cast_remedies(trace, off, g.param_dtype)),
        )
        return  # the outermost unit: the units inside it get what it passes on


RULE = Rule(
    code="DD602",
    name="fsdp-uncast-inputs",
    severity="error",
    summary="fully_shard with MixedPrecisionPolicy(param_dtype=..., cast_forward_inputs=False) and floating inputs in another dtype.",
    why=(
        "With a param_dtype, FSDP2 all-gathers the unit's weights in that dtype for its forward. It casts the unit's "
        "floating inputs to it only when cast_forward_inputs is True (the default); otherwise an fp32 activation meets "
        "bf16 weights in the first matmul, which raises."
    ),
    example=(
        "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, cast_forward_inputs=False))\n"
        "model(torch.randn(4, 16))\n"
        "RuntimeError: mat1 and mat2 must have the same dtype"
    ),
    fix="Cast the inputs to param_dtype, or leave cast_forward_inputs=True.",
    fix_safety="cast-inputs is safe.",
    check=check,
    device_note="Judged from the unit's policy and the inputs its forward got.",
)
