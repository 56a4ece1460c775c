"""DD402: an optimizer updates float16 parameters with an eps that is 0 in float16."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import FP32_TRAINABLE
from dtype_doctor.rules.base import Rule

# float16's smallest subnormal is 2**-24; anything at or below half of it rounds to 0.
FP16_ZERO_BELOW = 2.0 ** -25


def check(trace: Trace) -> Iterator[Finding]:
    # Under float16 autocast, fp16 trainables are DD401's: GradScaler refuses their gradients before any step.
    if not trace.train or trace.autocast == "float16":
        return
    half = [p for p in trace.model.parameters if p.requires_grad and p.dtype == "float16"]
    for group in trace.optimizers:
        if "float16" not in group.dtypes or group.eps is None or not 0 < group.eps <= FP16_ZERO_BELOW:
            continue
        yield RULE.finding(
            f"{group.optimizer} updates float16 parameters with eps={group.eps:g}, which is 0 in float16: every "
            "parameter whose gradient is 0 in a step (an embedding row the batch did not use) becomes 0/0 = NaN "
            "after the first step",
            stage="optimizer",
            tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in half[:6]),
            remedies=(FP32_TRAINABLE,),
            hints=("or give the optimizer an eps float16 holds (eps=1e-4; the smallest is about 6e-8)",),
        )
        return


RULE = Rule(
    code="DD402",
    name="fp16-optimizer-eps-zero",
    severity="error",
    summary="An optimizer (Adam, AdamW, RMSprop…) updates float16 parameters with an eps float16 rounds to 0.",
    why=(
        "Adam divides by sqrt(v) + eps in the parameters' dtype. eps=1e-8 is below float16's smallest subnormal "
        "(6e-8) and rounds to 0, so a parameter with a zero gradient (an embedding row the batch did not use, "
        "a frozen branch) gets 0 / (0 + 0) = NaN at the first step; the NaN spreads from there to the whole run."
    ),
    example=(
        "model.half(); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # eps=1e-8\n"
        "loss.backward(); opt.step()  # every embedding row not in the batch is now NaN"
    ),
    fix="Keep trainable parameters in float32 (fp32-trainable: fp32 master weights) and run fp16 through autocast; "
        "or set an eps float16 holds (1e-4).",
    fix_safety="fp32-trainable is safe: it raises precision.",
    check=check,
)
