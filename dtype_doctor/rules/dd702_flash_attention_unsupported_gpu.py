"""DD702: attn_implementation flash_attention_2/3 on a target flash-attn does not run on."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.rules.attention import (FLASH_GPU_ERROR, FLASH_IMPLEMENTATIONS, flash_attn_raised, flash_attn_refusal,
                                    implementation_of)
from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule
from dtype_doctor.rules.dd701_flash_attention_float32 import where


def check(trace: Trace) -> Iterator[Finding]:
    impl, origin, traced_as = implementation_of(trace)
    version = FLASH_IMPLEMENTATIONS.get(impl or "")
    if version is None:
        return
    # the dtype is DD701's: only the device and the GPU here
    refusal = flash_attn_refusal(version, None, trace.gpu_capability, trace.device)
    if refusal is None:
        return
    error, why = refusal
    module, module_type = where(trace)
    instead = f"; traced with {traced_as} in its place" if traced_as else ""
    gpu = f" ({trace.gpu})" if trace.gpu else ""
    yield RULE.finding(
        f"attn_implementation={impl!r} on {trace.device}{gpu}: {why}{instead}",
        module=module,
        module_type=module_type,
        stage="model-loading",
        pytorch_error=error,
        hints=("use attn_implementation='sdpa': on GPUs before sm80 torch runs it with the memory-efficient or math "
               "backend (target.attention says which)",
               *(("or, when the job runs on a GPU, trace that target: --simulate --device cuda --gpu NAME",)
                 if not trace.device.startswith("cuda") else ())),
    )


RULE = Rule(
    code="DD702",
    name="flash-attention-unsupported-gpu",
    severity="error",
    summary="attn_implementation flash_attention_2/3 on a GPU below its compute capability (sm80; FA3 sm90), or on no GPU.",
    why=(
        "flash-attn's kernels exist for Ampere and newer (FlashAttention-3 for Hopper): on a T4 or a V100 its first "
        "forward raises \"FlashAttention only supports Ampere GPUs or newer.\", and transformers refuses to load it "
        "where no CUDA GPU is present. The model loads on the machine that builds the job and fails on the one that runs it."
    ),
    example="model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float16, attn_implementation='flash_attention_2')\n"
            "# on a T4 (sm75): RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
    fix="Use attn_implementation='sdpa' on these GPUs (torch picks memory-efficient or math attention there).",
    fix_safety="display-only: the attention implementation is your loading code's.",
    check=check,
    # The simulated flash-attn raises its own refusal at the first forward: this rule explains that stop (not DD001).
    explains=lambda trace: flash_attn_raised(trace, FLASH_GPU_ERROR),
    references=("flash-attention csrc/flash_attn/flash_api.cpp mha_fwd",
                "transformers modeling_flash_attention_utils.py FLASH_ATTENTION_COMPATIBILITY_MATRIX"),
    device_note="Judged against the --gpu profile of a simulated CUDA target; without a profile only the device type is judged.",
)
