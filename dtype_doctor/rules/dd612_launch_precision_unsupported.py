"""DD612: the launch's precision is one the --gpu profile does not run natively."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    launch, cc = trace.launch, trace.gpu_capability
    if launch is None or cc is None:
        return
    wanted = launch.mixed_precision or ("bf16" if launch.ds_bf16 == "true" else "fp16" if launch.ds_fp16 == "true" else None)
    if wanted == "fp8" and tuple(cc) < (8, 9):
        message = (f"mixed_precision=fp8 on {trace.gpu}: accelerate warns that compute capability 8.9 is needed and trains in "
                   "fp16 instead (with its loss scaler and fp16's range)")
    elif wanted == "bf16" and tuple(cc) < (8, 0):
        message = (f"bf16 on {trace.gpu}: no bfloat16 tensor cores before Ampere (8.0); torch.cuda.is_bf16_supported() still "
                   "says True, so the job runs, with bf16 matmuls emulated at a fraction of fp16's speed")
    else:
        return
    yield RULE.finding(
        message,
        stage="launch",
        hints=("use fp16 with a GradScaler on this GPU, or a GPU of compute capability 8.0+ (8.9+ for fp8)",),
    )


RULE = Rule(
    code="DD612",
    name="launch-precision-unsupported",
    severity="warning",
    summary="The launch asks for bf16 on a GPU before Ampere, or fp8 below compute capability 8.9.",
    why=(
        "These launches do not fail: accelerate replaces fp8 by fp16 with a warning, and bf16 runs emulated on a T4 or "
        "V100. The job trains in another precision, or much slower, than the configuration says."
    ),
    example="accelerate launch --mixed_precision bf16 train.py  # on a T4 (7.5)",
    fix="Match the precision to the GPU: fp16 + GradScaler before Ampere; fp8 on Ada/Hopper.",
    fix_safety="display-only.",
    check=check,
    device_note="Judged for the --gpu profile the simulated launch targets.",
)
