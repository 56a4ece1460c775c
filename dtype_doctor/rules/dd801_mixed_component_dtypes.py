"""DD801: a pipeline's components are in dtypes that do not mix where one hands tensors to another."""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from dtype_doctor.rules.components import component_dtypes, is_vae
from dtype_doctor.records import HALF, Finding, ModelInfo, Remedy, TensorMeta, Trace
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import classify_error

PIPELINE = "the pipeline"


def source_of(model: ModelInfo, t: TensorMeta) -> str:
    """The component a tensor was made in (its origin's module or parameter), else the pipeline's own code."""
    origin = t.origin or ""
    if origin.startswith("created:"):
        module = origin.split("@", 1)[1] if "@" in origin else ""
        return model.component_of(module) or PIPELINE
    if origin.startswith(("param:", "buffer:")):
        return model.component_of(origin.split(":", 1)[1]) or PIPELINE
    return PIPELINE


def check(trace: Trace) -> Iterator[Finding]:
    model = trace.model
    if not model.components:
        return
    dtypes = component_dtypes(model)
    classes = dict(model.components)
    met: dict[str, dict[str, set[str]]] = {}  # receiving component → source → dtypes it sent
    first: dict[str, tuple[str, str, int]] = {}
    refused: dict[str, int] = {}
    for op in trace.ops:
        if op.phase != "forward" or op.error is None or classify_error(op.error, op.operands) != "dtype":
            continue
        into = model.component_of(op.module)
        want = dtypes.get(into or "")
        if into is None or want is None:
            continue
        odd = [t for t in op.operands if t.is_floating and t.dtype != want and t.role not in ("weight", "bias", "buffer")]
        if not odd:
            continue
        refused[into] = refused.get(into, 0) + 1
        first.setdefault(into, (op.module, op.module_type, op.index))
        for t in odd:
            met.setdefault(into, {}).setdefault(source_of(model, t), set()).add(t.dtype)
    for into, sources in met.items():
        if set(sources) == {PIPELINE} and not model.class_name.endswith("Pipeline"):
            continue  # a script's model fed the script's own tensors, from no other model: DD101 says it
        want = dtypes[into]
        said = "; ".join(
            f"{', '.join(sorted(d))} from {src}" + (f" ({dtypes[src]})" if src in dtypes else "")
            for src, d in sorted(sources.items())
        )
        module, module_type, _ = first[into]
        others = sorted(s for s in sources if s in dtypes)
        follows = (f"; the pipeline's own tensors (latents, timestep embeddings) follow "
                   f"{others[0]}'s dtype" if PIPELINE in sources and others else "")
        yield RULE.finding(
            f"{into} ({classes[into]}) is {want} but receives {said}{follows}: {refused[into]} of its ops refuse "
            f"the mix (DD101 names each), first at {module}",
            module=into,
            module_type=classes[into],
            stage="model-loading",
            remedies=_remedies(dtypes, into, sources, classes[into]),
            hints=(f"or put the whole pipeline in one dtype: pipe.to(torch.{want}), or load it with "
                   f"DiffusionPipeline.from_pretrained(..., torch_dtype=torch.{want})",
                   "or keep a component in another dtype only where the pipeline casts between them "
                   "(as SDXL's does for an fp32 VAE with vae.config.force_upcast)"),
        )


def _remedies(dtypes: dict[str, str | None], into: str, sources: dict[str, set[str]], cls: str) -> list[Remedy]:
    """Cast the odd component out to the pipeline's dtype (the one most components have; on a tie,
    the one `into` was handed): `into` itself, or the components that handed it another dtype. A
    float32 VAE in a half pipeline is kept (its decoder safe from fp16 overflow) and its latents cast."""
    if dtypes[into] == "float32" and is_vae(into, cls) and any(d in HALF for ds in sources.values() for d in ds):
        return [Remedy("vae-fp32", into, "float32", stage="model-loading")]
    counts = Counter(d for d in dtypes.values() if d)
    handed = Counter(d for ds in sources.values() for d in ds)
    top = max(counts.values())
    tied = [d for d, n in counts.items() if n == top]
    pipeline = tied[0] if len(tied) == 1 else max(tied, key=lambda d: handed.get(d, 0))
    odd = [into] if dtypes[into] != pipeline else [s for s in sources if dtypes.get(s) not in (None, pipeline)]
    return [Remedy("cast-component", name, pipeline, stage="model-loading") for name in odd]


RULE = Rule(
    code="DD801",
    name="mixed-component-dtypes",
    severity="error",
    summary="A diffusers pipeline's components are in dtypes that do not mix where one hands its output to another.",
    why=(
        "A pipeline moves tensors between its components: the text encoder's prompt embeddings into the UNet's "
        "cross-attention, the latents (made in the prompt embeddings' dtype) into the UNet, the UNet's latents into "
        "the VAE. A component cast on its own (pipe.unet.to(torch.bfloat16)), loaded in another dtype, or swapped "
        "in (a GGUF transformer, an fp32 VAE) meets the others' tensors in its first Linear or Conv: "
        "\"mat1 and mat2 must have the same dtype, but got Float and BFloat16\"."
    ),
    example="pipe = StableDiffusionPipeline.from_pretrained(p)\npipe.unet.to(torch.bfloat16)\n"
            "pipe('a cat')  # RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16",
    fix="Cast the odd component to the pipeline's dtype (pipe.unet.to(torch.float32)), or load or cast the whole "
        "pipeline in one dtype (torch_dtype= at from_pretrained, or pipe.to(dtype)).",
    fix_safety="safe: cast-component casts the odd component up to the others' dtype (casting one down is applied only "
               "when asked for by name, --strategy cast-component); fix PIPELINE_DIR verifies it by re-tracing the step.",
    check=check,
    references=("https://github.com/huggingface/diffusers/issues/11436", "https://github.com/huggingface/diffusers/issues/11117"),
    device_note="The same on CPU and CUDA: Linear and Conv refuse mixed dtypes outside autocast on both.",
)
