"""DD802: a diffusers pipeline's VAE runs in float16 and its decoder leaves float16's range."""

from __future__ import annotations

import math
from typing import Iterator

from dtype_doctor.rules.components import component_dtypes, is_vae
from dtype_doctor.records import FP16_MAX, Finding, Remedy, Trace
from dtype_doctor.rules._numerics import FORECAST_MARGIN, module_outputs, overflowed, value
from dtype_doctor.rules.base import Rule


def _vaes(trace: Trace) -> list[str]:
    dtypes = component_dtypes(trace.model)
    return [name for name, cls in trace.model.components
            if is_vae(name, cls) and dtypes.get(name) == "float16"]


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.model.components or not trace.values_measured:
        return
    for vae in _vaes(trace):
        cls = dict(trace.model.components)[vae]
        inside = [op for op in trace.ops if trace.model.component_of(op.module) == vae]
        hit = next((op for op in inside if overflowed(op)), None)
        outputs = {name: s for name, s in module_outputs(trace).items() if trace.model.component_of(name) == vae}
        if hit is not None:
            nan_out = any(not s.finite for s in outputs.values())
            yield RULE.finding(
                f"{vae} ({cls}) runs in float16 and overflows at {hit.module}: finite inputs gave inf"
                f"{', and the decoded image is NaN' if nan_out else ''} (DD301 names the op)",
                module=vae,
                module_type=cls,
                op=hit.op,
                stage="model-loading",
                remedies=(Remedy("vae-fp32", vae, "float32", stage="model-loading"),),
                hints=_HINTS,
            )
            continue
        near = [(name, s.absmax) for name, s in outputs.items() if math.isfinite(s.absmax) and s.absmax * FORECAST_MARGIN >= FP16_MAX]
        if near:
            name, biggest = max(near, key=lambda x: x[1])
            yield RULE.finding(
                f"{vae} ({cls}) runs in float16 and {name} reaches {value(biggest)}, within {FORECAST_MARGIN:g}x of "
                f"float16's {value(FP16_MAX)}: a larger image or another prompt decodes to NaN",
                module=vae,
                module_type=cls,
                stage="model-loading",
                severity="warning",
                remedies=(Remedy("vae-fp32", vae, "float32", stage="model-loading"),),
                hints=_HINTS,
            )


_HINTS = (
    "or use a VAE fine-tuned to stay in float16's range (madebyollin/sdxl-vae-fp16-fix)",
)

RULE = Rule(
    code="DD802",
    name="fp16-vae-overflow",
    severity="error",
    summary="A diffusers pipeline's VAE runs in float16 and its decoder's values leave float16's range (the image decodes to NaN).",
    why=(
        "A VAE decoder's activations grow with the image: SDXL's reach values float16 cannot hold (65504), so an "
        "fp16 pipeline decodes to NaN, a black image, with no error. float32 (or bfloat16's range) holds them; "
        "SDXL's pipelines upcast the VAE when its config sets force_upcast."
    ),
    example="pipe = StableDiffusionXLPipeline.from_pretrained(p, torch_dtype=torch.float16)\n"
            "pipe.vae.config.force_upcast = False\nimage = pipe('a cat').images[0]  # black: NaN in the decoder",
    fix="Keep the VAE in float32 for decoding, or use an fp16-safe VAE.",
    fix_safety="safe: vae-fp32 keeps the VAE in float32 and casts the latents it decodes; more memory for the VAE, "
               "no precision lost. fix PIPELINE_DIR verifies it by re-tracing the step.",
    check=check,
    references=("diffusers pipeline_stable_diffusion_xl.py: needs_upcasting = vae.dtype == float16 and vae.config.force_upcast",
                "https://huggingface.co/madebyollin/sdxl-vae-fp16-fix"),
    device_note="Judged from values measured on the trace's device; a simulated trace holds none, so it says nothing there.",
)
