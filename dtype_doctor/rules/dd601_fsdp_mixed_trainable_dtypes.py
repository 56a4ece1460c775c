"""DD601: a fully_shard unit whose trainable parameters have more than one dtype."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import FP32_TRAINABLE
from dtype_doctor.rules.base import Rule

# What FSDP2 raises (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, _init_mp_dtypes).
RAISED = "FSDP expects uniform original parameter dtype"


def torch_set(dtypes: tuple[str, ...]) -> str:
    """{torch.bfloat16, torch.float32}, as FSDP's message prints the set."""
    return "{" + ", ".join(f"torch.{d}" for d in dtypes) + "}"


def check(trace: Trace) -> Iterator[Finding]:
    failure = trace.failure.message if trace.failure and RAISED in trace.failure.message else None
    state = {p.name: p for p in trace.model.parameters}
    for g in trace.shards:
        if len(g.trainable_dtypes) < 2:
            continue
        tensors = tuple(TensorMeta(state[n].dtype, state[n].device, state[n].shape, "weight", n, f"param:{n}")
                        for n in g.trainable if n in state)
        where = f"fully_shard({g.module or 'the model'})"
        yield RULE.finding(
            f"{where} holds trainable parameters in {' and '.join(g.trainable_dtypes)}: the first forward raises "
            f"'{RAISED} but got {torch_set(g.trainable_dtypes)}' at FSDP's lazy init",
            module=g.module,
            module_type=trace.model.module_type(g.module),
            stage="model-loading",
            tensors=tensors,
            pytorch_error=failure,
            remedies=(FP32_TRAINABLE,),
        )


RULE = Rule(
    code="DD601",
    name="fsdp-mixed-trainable-dtypes",
    severity="error",
    summary="A fully_shard (FSDP2) unit whose trainable parameters are not all one dtype: FSDP raises at the first forward.",
    why=(
        "FSDP2 all-gathers and reduce-scatters each unit's parameters as one flat buffer per dtype it was given: "
        "every trainable parameter of a unit must have the same original dtype. fp32 LoRA adapters beside trainable "
        "bf16 weights (modules_to_save, a resized embedding) stop the job after the launch, at lazy init."
    ),
    example=(
        "model.to(torch.bfloat16); model.score = nn.Linear(h, 2)  # float32, trainable\n"
        "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))\n"
        "model(**batch)\n"
        "AssertionError: FSDP expects uniform original parameter dtype but got {torch.bfloat16, torch.float32}"
    ),
    fix="Give the unit's trainable parameters one dtype (fp32-trainable: float32; MixedPrecisionPolicy's param_dtype still computes in bf16), or shard the odd module as its own unit.",
    fix_safety="fp32-trainable is safe.",
    check=check,
    device_note="Judged from the unit's parameters; the same on every device and world size.",
)
