"""DD110: trainable parameters (and so optimizer state) in fp16/bf16 during training."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import FP32_TRAINABLE
from dtype_doctor.rules.base import Rule


def half_trainable(trace: Trace, dtypes: frozenset[str] = frozenset({"float16", "bfloat16"})) -> list:
    return [p for p in trace.model.parameters if p.requires_grad and p.dtype in dtypes]


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.train:
        return
    half = half_trainable(trace)
    if not half:
        return
    trainable = [p for p in trace.model.parameters if p.requires_grad]
    module = half[0].name.rsplit(".", 1)[0]
    yield RULE.finding(
        f"{len(half)} of {len(trainable)} trainable parameters are {half[0].dtype}: the optimizer keeps its state and "
        "updates in half precision, and small updates round away",
        module=module,
        module_type=trace.model.module_type(module),
        stage="model-loading",
        tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in half[:6]),
        remedies=(FP32_TRAINABLE,),
    )


RULE = Rule(
    code="DD110",
    name="half-precision-master-weights",
    severity="warning",
    summary="Trainable parameters (and so optimizer state) are fp16/bf16 during training.",
    why=(
        "Mixed precision keeps fp32 master weights: an update of 1e-4 on a weight of 1.0 is below bf16's "
        "resolution (2^-8) and below fp16's (2^-11), so it is rounded away and training stalls without an error. "
        "dtype='auto' loads bf16 checkpoints in bf16, so full fine-tuning silently trains in half precision."
    ),
    example="model = AutoModelForCausalLM.from_pretrained(p)  # bf16 checkpoint, dtype='auto'\nTrainer(model, args).train()",
    fix="Load trainable parameters in float32 and run the forward under autocast (fp32-trainable).",
    fix_safety="fp32-trainable is safe: it raises precision.",
    check=check,
)
