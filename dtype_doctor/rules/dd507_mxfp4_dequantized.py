"""DD507: an MXFP4 checkpoint that transformers dequantized to bfloat16 on load, and why.

transformers' Mxfp4HfQuantizer (quantizers/quantizer_mxfp4.py, 5.24) logs one warning and sets
`quantization_config.dequantize = True` when the GPU is below compute capability 7.5 (line 95),
Triton is missing or too old (line 104), the `kernels` package is missing (line 113), on the CPU
without use_kernels=True (line 179), or with use_kernels=True on a GPU (line 172). The model then
holds bfloat16 experts: four times the memory of the checkpoint, and not the model that was asked for.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    low = trace.loaded.lowbit if trace.loaded is not None else None
    if low is None or low.fallback is None or low.fallback.setting != "quantization":
        return
    fb = low.fallback
    where = trace.gpu or ("this CPU" if not trace.simulated else trace.device)
    yield RULE.finding(
        f"the checkpoint is {fb.requested.upper()} and runs as {fb.actual} on {where}: {fb.reason} ({fb.mirrors})",
        stage="model-loading",
        severity="info" if not trace.train else "warning",
        hints=("install triton (>= 3.4 on CUDA) and `kernels`, on a GPU of compute capability 7.5 or later; or ask for "
               "the bf16 model outright with Mxfp4Config(dequantize=True)",),
    )


RULE = Rule(
    code="DD507",
    name="mxfp4-dequantized-to-bf16",
    severity="warning",
    summary="An MXFP4 checkpoint (gpt-oss) that transformers silently dequantized to bfloat16: the GPU, Triton or the kernels package.",
    why=(
        "Mxfp4Config loads run in MXFP4 only with Triton, the `kernels` package and a GPU of compute capability 7.5+. "
        "Otherwise transformers logs one warning line and dequantizes every expert to bfloat16 (transformers#39969): "
        "the 20B model needs about four times the memory the checkpoint promised, and the numbers are not MXFP4's."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained('openai/gpt-oss-20b')   # on a machine without triton\n"
        "MXFP4 quantization requires Triton ... We will default to dequantizing the model to bf16."
    ),
    fix="Install triton and kernels on a compute capability 7.5+ GPU, or ask for the bf16 model with Mxfp4Config(dequantize=True).",
    fix_safety="display-only: the environment, not the script, decides.",
    check=check,
    references=("https://github.com/huggingface/transformers/blob/main/src/transformers/quantizers/quantizer_mxfp4.py",
                "https://github.com/huggingface/transformers/issues/39969"),
    device_note="Judged for the target (--gpu's capability, or this CPU) and this environment's triton and kernels.",
)
