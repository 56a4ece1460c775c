"""DD109: a buffer that must stay fp32 (rotary inv_freq, …) was cast to half precision.

A rotary embedding whose frequencies transformers can recompute (its module's init function and
config) is judged by a bound: its half copy must keep every angle, at the model's longest position,
within half a position of the float32 one (dtype_doctor/trace/rope.py has the measurements). bfloat16 rounds
by up to 2**-8, so it can fail from position 128 on: llama-tiny's 128 positions pass (0.12 of a position
at 127), a 4096-position head_dim-128 model does not (15 positions at 4095).
Other buffers of the pattern (cos/sin caches, freqs_cis, timescales) are reported as before.
"""

from __future__ import annotations

import re
from typing import Iterator

from dtype_doctor.records import Finding, StateTensor, TensorMeta, Trace
from dtype_doctor.rules._common import half_model_remedy, is_half
from dtype_doctor.rules.base import Rule

# Half a position: the bound a rotary buffer's rounding is judged by (dtype_doctor/trace/rope.py says why).
POSITION_BOUND = 0.5
# Buffers computed at init in fp32 whose half copy loses positions: frequencies and caches.
FP32_BUFFER = re.compile(r"(^|\.)(inv_freq|original_inv_freq|_?cos_cached|_?sin_cached|freqs(_cis)?|timescale)$")


def check(trace: Trace) -> Iterator[Finding]:
    bad = [
        b
        for b in trace.model.buffers
        if is_half(b.dtype)
        and (FP32_BUFFER.search(b.name) or "Rotary" in trace.model.module_type(b.name.rsplit(".", 1)[0]))
    ]
    by_module: dict[str, list[StateTensor]] = {}
    for b in bad:
        by_module.setdefault(b.name.rsplit(".", 1)[0] if "." in b.name else "", []).append(b)
    facts = {r.module: r for r in trace.model.rotary}
    for module, buffers in by_module.items():
        dtype = buffers[0].dtype
        rotary = facts.get(module)
        error = rotary.error_in(dtype) if rotary is not None else None
        if error is not None and error[1] < POSITION_BOUND:
            continue  # within the bound at this model's longest position: the rounding costs under half a position
        names = f"{', '.join(b.name for b in buffers[:4])}{' …' if len(buffers) > 4 else ''}"
        if error is not None and rotary is not None:
            radians, positions = error
            why = (f"at position {rotary.max_position - 1} (max_position_embeddings {rotary.max_position}, head_dim "
                   f"{rotary.head_dim}) a rotary angle is off by {radians:.3g} rad, the angle of {positions:.3g} positions "
                   f"(bound: {POSITION_BOUND} of a position)")
        else:
            why = "rotary frequencies lose precision at long positions"
        yield RULE.finding(
            f"{len(buffers)} fp32 buffer(s) are {dtype}: {names}; {why}",
            module=module,
            module_type=trace.model.module_type(module),
            stage="model-loading",
            tensors=tuple(TensorMeta(b.dtype, b.device, b.shape, "buffer", b.name, f"buffer:{b.name}") for b in buffers[:8]),
            remedies=(half_model_remedy(dtype, module),),
        )


RULE = Rule(
    code="DD109",
    name="buffer-precision-loss",
    severity="warning",
    summary="A buffer that must stay fp32 (rotary inv_freq, ...) was cast to half precision.",
    why=(
        "model.to(torch.bfloat16) or model.half() casts every floating buffer, including the rotary "
        "embedding's inv_freq. Each frequency is then off by up to 2**-8 of itself (bf16) and every angle "
        "position * frequency by as many positions' worth: at position 4095 of a head_dim-128 Llama, 5.0 rad, the "
        "angle of 15 positions. A rotary buffer is reported when, at the model's longest position, an angle is off "
        "by half a position or more; long-context quality drops with no error."
    ),
    example="model = AutoModelForCausalLM.from_pretrained(p); model.to(torch.bfloat16)  # inv_freq now bf16",
    fix="Load with from_pretrained(..., dtype=torch.bfloat16), which keeps these buffers fp32, or recompute them.",
    fix_safety="half-model (dtype= at load) changes weight precision (unsafe).",
    check=check,
)
