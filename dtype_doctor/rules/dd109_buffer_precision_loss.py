"""DD109: a buffer that must stay fp32 (rotary inv_freq, …) was cast to half precision."""

from __future__ import annotations

import re
from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import half_model_remedy, is_half
from dtype_doctor.rules.base import Rule

# Buffers computed at init in fp32 whose half copy loses positions: frequencies and caches.
FP32_BUFFER = re.compile(r"(^|\.)(inv_freq|original_inv_freq|_?cos_cached|_?sin_cached|freqs(_cis)?|timescale)$")


def check(trace: Trace) -> Iterator[Finding]:
    bad = [
        b
        for b in trace.model.buffers
        if is_half(b.dtype)
        and (FP32_BUFFER.search(b.name) or "Rotary" in trace.model.module_type(b.name.rsplit(".", 1)[0]))
    ]
    if not bad:
        return
    module = bad[0].name.rsplit(".", 1)[0]
    yield RULE.finding(
        f"{len(bad)} fp32 buffer(s) are {bad[0].dtype}: {', '.join(b.name for b in bad[:4])}"
        f"{' …' if len(bad) > 4 else ''}; rotary frequencies lose precision at long positions",
        module=module,
        module_type=trace.model.module_type(module),
        stage="model-loading",
        tensors=tuple(TensorMeta(b.dtype, b.device, b.shape, "buffer", b.name, f"buffer:{b.name}") for b in bad[:8]),
        remedies=(half_model_remedy(bad[0].dtype, module),),
    )


RULE = Rule(
    code="DD109",
    name="buffer-precision-loss",
    severity="warning",
    summary="A buffer that must stay fp32 (rotary inv_freq, ...) was cast to half precision.",
    why=(
        "model.to(torch.bfloat16) or model.half() casts every floating buffer, including the rotary "
        "embedding's inv_freq. In bf16 (8 bits of mantissa) positions beyond a few hundred collapse onto each "
        "other, and long-context quality drops with no error."
    ),
    example="model = AutoModelForCausalLM.from_pretrained(p); model.to(torch.bfloat16)  # inv_freq now bf16",
    fix="Load with from_pretrained(..., dtype=torch.bfloat16), which keeps these buffers fp32, or recompute them.",
    fix_safety="half-model (dtype= at load) changes weight precision (unsafe).",
    check=check,
)
