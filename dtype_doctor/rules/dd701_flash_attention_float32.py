"""DD701: attn_implementation flash_attention_2/3 with a model that computes in float32."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.rules.attention import FLASH_DTYPE_ERROR, FLASH_IMPLEMENTATIONS, flash_attn_raised, implementation_of, sdpa_calls
from dtype_doctor.records import HALF, Finding, Remedy, Trace
from dtype_doctor.rules.base import Rule


def where(trace: Trace) -> tuple[str, str]:
    """The first attention call's module (the layer flash-attn would run in), else the model."""
    calls = sdpa_calls(trace)
    if calls:
        op = calls[0][0]
        return op.module, op.module_type
    return "", trace.model.class_name


def check(trace: Trace) -> Iterator[Finding]:
    impl, origin, traced_as = implementation_of(trace)
    if impl not in FLASH_IMPLEMENTATIONS:
        return
    dtype = trace.autocast or trace.model.main_dtype
    if dtype is None or dtype in HALF:
        return
    module, module_type = where(trace)
    set_in = {"config": "config.json", "call": "from_pretrained(attn_implementation=...)"}.get(origin or "", "the model's config")
    instead = f"; traced with {traced_as} in its place" if traced_as else ""
    yield RULE.finding(
        f"attn_implementation={impl!r} (set in {set_in}) with {dtype} weights and no autocast: transformers only warns "
        f"at load, then casts query, key and value to the weights' {dtype} and flash-attn refuses them at the first "
        f"forward{instead}",
        module=module,
        module_type=module_type,
        stage="model-loading",
        pytorch_error=FLASH_DTYPE_ERROR,
        remedies=(Remedy("autocast", "forward", "float16" if trace.gpu_capability and trace.gpu_capability < (8, 0) else "bfloat16"),),
        hints=(f"or load with dtype=torch.bfloat16 next to attn_implementation={impl!r}",
               "or use attn_implementation='sdpa', which runs float32 (memory-efficient or math backend)"),
    )


RULE = Rule(
    code="DD701",
    name="flash-attention-float32",
    severity="error",
    summary="attn_implementation flash_attention_2/3 on a model that computes in float32 (no half dtype, no autocast).",
    why=(
        "flash-attn computes in float16 or bfloat16 only. transformers 5 loads a float32 model with "
        "flash_attention_2 and only logs \"Flash Attention 2 only supports torch.float16 and torch.bfloat16 dtypes\"; "
        "at the first forward it casts query, key and value to the dtype of the model's Linear weights (float32 "
        "unless autocast is on) and flash-attn raises \"FlashAttention only support fp16 and bf16 data type\"."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained(p, attn_implementation='flash_attention_2')  # float32 weights\n"
        "model(**batch)  # RuntimeError: FlashAttention only support fp16 and bf16 data type"
    ),
    fix="Load with dtype=torch.bfloat16 (or float16), or run the forward under torch.autocast, or use 'sdpa'.",
    fix_safety="autocast is safe (weights stay float32); dtype= at load is half-model (unsafe: precision).",
    check=check,
    # The simulated flash-attn raises its own refusal at the first forward: this rule explains that stop (not DD001).
    explains=lambda trace: flash_attn_raised(trace, FLASH_DTYPE_ERROR),
    references=(
        "https://github.com/volcengine/verl/issues/1498",
        "transformers modeling_utils.py _flash_attn_can_dispatch; integrations/flash_attention.py get_target_dtype",
        "flash-attention csrc/flash_attn/flash_api.cpp mha_fwd",
    ),
    device_note="Judged for the CUDA target the implementation needs; on a CPU-only machine the model is traced with SDPA in its place.",
)
