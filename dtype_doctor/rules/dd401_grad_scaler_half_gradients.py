"""DD401: fp16 AMP with GradScaler while trainable parameters are fp16."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, FixSuggestion, TensorMeta, Trace
from dtype_doctor.rules._common import FP32_TRAINABLE
from dtype_doctor.rules.base import Rule
from dtype_doctor.rules.dd110_half_precision_master_weights import half_trainable


def check(trace: Trace) -> Iterator[Finding]:
    # fp16 autocast is the configuration that needs a GradScaler; bf16 gradients it accepts.
    if not trace.train or trace.autocast != "float16":
        return
    half = half_trainable(trace, frozenset({"float16"}))
    if not half:
        return
    module = half[0].name.rsplit(".", 1)[0]
    yield RULE.finding(
        f"{len(half)} trainable parameters are float16 under float16 autocast: GradScaler.unscale_ will raise "
        "'Attempting to unscale FP16 gradients.'",
        module=module,
        module_type=trace.model.module_type(module),
        stage="optimizer",
        tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in half[:6]),
        fixes=(FixSuggestion("fp32-trainable", "safe", "keep trainable parameters in float32; autocast casts per op"),),
        remedies=(FP32_TRAINABLE,),
    )


RULE = Rule(
    code="DD401",
    name="grad-scaler-half-gradients",
    severity="error",
    summary="fp16 AMP with a GradScaler while trainable parameters (so their gradients) are fp16.",
    why=(
        "GradScaler unscales gradients in fp32 and refuses fp16 gradients. model.half() followed by the AMP "
        "recipe (autocast + GradScaler) fails at the first optimizer step, after the whole forward and backward."
    ),
    example=(
        "model.half(); scaler = torch.amp.GradScaler()\n"
        "with torch.autocast('cuda', dtype=torch.float16): loss = model(**batch).loss\n"
        "scaler.scale(loss).backward(); scaler.step(opt)\n"
        "ValueError: Attempting to unscale FP16 gradients."
    ),
    fix="Keep the trainable parameters in float32 (fp32-trainable); autocast still runs the matmuls in fp16.",
    fix_safety="fp32-trainable is safe.",
    check=check,
    device_note="GradScaler behaves the same on CPU (torch.amp.GradScaler('cpu')) and CUDA.",
)
