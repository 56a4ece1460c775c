"""A diffusers pipeline, traced as one step: text encoder → UNet/transformer → one scheduler step → VAE decode.

    from dtype_doctor.integrations.diffusion import diagnose_pipeline   # the public name
    report = diagnose_pipeline(pipe, prompt="a photo of a cat")
    report.target.components      # each component's class, dtype and device
    [f.module for f in report.findings]   # "unet.down_blocks.0.attentions.0...", "vae.decoder..."

Every component that is a torch module is traced as itself: the pipeline's modules are held, not
moved or copied, in one container whose children are named as the pipeline names its components,
so a finding's module path starts with its component ("unet.conv_in", "text_encoder.text_model...").
The pipeline runs as the user's call would, with one denoising step and a small image, and the
recorder steps over each refusal (repairing it as the fix would), so one pass names every mismatch.
Nothing is changed: parameters, buffers and devices are as they were.

This is the engine (the rules' layer), so `scan`/`fix PIPELINE_DIR` and the fix strategies can
use it; dtype_doctor.integrations.diffusion is its public face.
"""

from __future__ import annotations

from typing import Any

import torch

from dtype_doctor.records import Report, Subject
from dtype_doctor.trace.request import TraceRequest


class PipelineComponents(torch.nn.Module):
    """A pipeline's torch modules as children named by their component names (held, not copied).

    The one container of models traced as one: `diagnose_pipeline`'s, and `run`'s for a script whose
    step calls several models (run/models.py), where `modules` may add the script's own models to a
    pipeline's, or be a script's models alone (a teacher and a student: `pipeline` None, `name` says
    what the report calls them)."""

    def __init__(self, pipeline: Any, modules: dict[str, torch.nn.Module] | None = None, *, name: str | None = None) -> None:
        super().__init__()
        modules = modules_of(pipeline) if modules is None else modules
        self.pipeline = pipeline  # not a module: held, never traced as a child
        # What the report calls the model: the pipeline's class, else `name`.
        self.pipeline_class = type(pipeline).__name__ if pipeline is not None else name or " + ".join(modules)
        self._classes = tuple((name, type(m).__name__) for name, m in modules.items())
        # The modules each component declares fp32 (T5's "wo"), as the container's own: the rules and
        # the recorder read a model's declaration, and a pipeline's is the union of its components'.
        self._keep_in_fp32_modules = list(dict.fromkeys(
            k for m in modules.values() for attr in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict")
            for k in getattr(m, attr, None) or ()))
        for name, module in modules.items():
            self.add_module(name, module)

    def pipeline_components(self) -> tuple[tuple[str, str], ...]:
        """(component name, class) of each traced component, in the pipeline's order."""
        return self._classes

    def with_component(self, name: str, module: torch.nn.Module) -> "PipelineComponents":
        """A new container over a shallow copy of the pipeline whose `name` is `module` (the rest shared)."""
        import copy

        if self.pipeline is None:
            raise TypeError("a container of a script's models holds no pipeline to copy")
        pipeline = copy.copy(self.pipeline)
        setattr(pipeline, name, module)
        return PipelineComponents(pipeline)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - a container is never called
        raise TypeError("the pipeline calls its components itself")


def modules_of(pipeline: Any) -> dict[str, torch.nn.Module]:
    """The pipeline's components that are torch modules (text encoders, UNet/transformer, VAE, adapters)."""
    components = getattr(pipeline, "components", None) or {}
    return {name: c for name, c in components.items() if isinstance(c, torch.nn.Module)}


def diagnose_pipeline(
    pipeline: Any,
    request: TraceRequest | None = None,
    *,
    prompt: str = "a photo",
    steps: int = 1,
    height: int | None = None,
    width: int | None = None,
    call: dict[str, Any] | None = None,
    **options: Any,
) -> Report:
    """Run `pipeline(prompt, num_inference_steps=steps, ...)` once under the recorder and judge it.

    `height`/`width` default to the smallest image the VAE decodes to one latent of the UNet's
    sample size; `call` adds keyword arguments to the pipeline call (guidance_scale, negative_prompt …).
    Options are TraceRequest fields, as for `diagnose`.
    """
    from dtype_doctor.diagnosis import as_request, watch

    request = as_request(request, options)
    if request.subject is None:
        request = request.with_(subject=Subject(model=type(pipeline).__name__))
    modules = modules_of(pipeline)
    if not modules:
        raise TypeError(f"{type(pipeline).__name__} holds no torch modules to trace")
    container = PipelineComponents(pipeline, modules)
    kwargs = call_arguments(pipeline, steps=steps, height=height, width=width, call=call)
    w = watch(container, request, raise_errors=False)
    try:
        with w, torch.no_grad():
            pipeline(prompt, **kwargs)
    except Exception:  # noqa: BLE001 - the report holds the failure (DD001 when no rule explains it)
        if w.report is None:
            raise
    assert w.report is not None
    return w.report


def call_arguments(pipeline: Any, *, steps: int = 1, height: int | None = None, width: int | None = None,
                   call: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keywords of the one traced call, `pipeline(prompt, **them)`: `steps` denoising steps, a numpy
    image of the smallest size the denoiser takes, `call` added; the progress bar turned off."""
    kwargs: dict[str, Any] = {"num_inference_steps": steps, "output_type": "np", **(call or {})}
    size = _image_size(pipeline)
    if size is not None:
        kwargs.setdefault("height", height or size)
        kwargs.setdefault("width", width or size)
    set_bar = getattr(pipeline, "set_progress_bar_config", None)
    if callable(set_bar):
        set_bar(disable=True)
    return kwargs


def _image_size(pipeline: Any) -> int | None:
    """The pixel size whose latent is the denoiser's configured sample size."""
    denoiser = getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)
    sample = getattr(getattr(denoiser, "config", None), "sample_size", None)
    factor = getattr(pipeline, "vae_scale_factor", None)
    if isinstance(sample, int) and isinstance(factor, int):
        return sample * factor
    return None
