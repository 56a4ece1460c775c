"""DD401: fp16 AMP with GradScaler while trainable parameters are fp16."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import FP32_TRAINABLE
from dtype_doctor.rules.base import Rule
from dtype_doctor.rules.dd110_half_precision_master_weights import half_trainable


def check(trace: Trace) -> Iterator[Finding]:
    # fp16 autocast is the configuration that needs a GradScaler. It refuses fp16 gradients
    # everywhere; bf16 gradients only on CUDA, whose _amp_foreach_non_finite_check_and_unscale_
    # kernel has no bfloat16 (the CPU kernel has).
    if not trace.train or trace.autocast != "float16":
        return
    refused = frozenset({"float16", "bfloat16"} if trace.device.startswith("cuda") else {"float16"})
    half = half_trainable(trace, refused)
    if not half:
        return
    module = half[0].name.rsplit(".", 1)[0]
    dtypes = sorted({p.dtype for p in half})
    raised = (
        "'Attempting to unscale FP16 gradients.'" if "float16" in dtypes
        else "\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'"
    )
    yield RULE.finding(
        f"{len(half)} trainable parameters are {' and '.join(dtypes)} under float16 autocast: GradScaler.unscale_ will raise {raised}",
        module=module,
        module_type=trace.model.module_type(module),
        stage="optimizer",
        tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in half[:6]),
        remedies=(FP32_TRAINABLE,),
    )


RULE = Rule(
    code="DD401",
    name="grad-scaler-half-gradients",
    severity="error",
    summary="fp16 AMP with a GradScaler while trainable parameters (so their gradients) are fp16 — or bf16 on CUDA.",
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
    device_note=(
        "fp16 gradients are refused on CPU and CUDA alike; bf16 gradients only on CUDA (the CPU unscale kernel "
        "implements bfloat16, the CUDA one does not)."
    ),
)
