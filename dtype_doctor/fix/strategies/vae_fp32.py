"""vae-fp32: keep a diffusers pipeline's VAE in float32 and decode the latents in float32 (DD802),
as SDXL's pipelines do when vae.config.force_upcast is true."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, listed
from dtype_doctor.fix.strategies.cast_component import component_edit
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt

# The modules a VAE decodes through, first to last: the latents come in at the first one there is.
DECODE_ENTRIES = ("post_quant_conv", "decoder")


class VaeFp32(
    Strategy, name="vae-fp32", applicability=SAFE, rank=13,
    summary="keep a diffusers pipeline's VAE in float32 and cast the latents it decodes (as force_upcast does)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        names = listed([f"pipe.{r.target}" for r in remedies])
        return (f"keep {names} in float32 and decode the latents in float32: pipe.vae.to(torch.float32), the latents "
                "cast as they enter its decoder (SDXL pipelines do this when vae.config.force_upcast is true)")

    def describe(self, c: Change) -> str:
        was = f" ({c.before} before)" if c.before not in (None, "float32") else ""
        return f"keep pipe.{c.target} in float32{was}, its latents cast to float32 as it decodes"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        pipe = getattr(pipeline.model, "pipeline", None)
        if pipe is None:
            raise Skip("not a diffusers pipeline")
        dtypes = {c["name"]: c["dtype"] for c in report.target.components or ()}
        # A half VAE (DD802) is cast up; a float32 one in a half pipeline (DD801) keeps its dtype: both get the casts.
        changes = {r.target: Change(self.name, r.target, "float32", dtypes.get(r.target), r.stage)
                   for r in self.remedies(report, ctx) if hasattr(getattr(pipe, r.target, None), "decoder")}
        if not changes:
            raise Skip("no VAE with a decoder among the components named")
        return tuple(changes.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        container = pipeline.model
        for c in changes:
            vae = copy.deepcopy(getattr(container.pipeline, c.target)).to(torch.float32)
            upcast_decoding(vae)
            container = container.with_component(c.target, vae)
        return pipeline.with_(model=container)

    def pipeline_lines(self, c: Change) -> list[str]:
        return [
            f"{{pipe}}.{c.target}.to(torch.float32)  # dtype-doctor: the VAE decodes in float32 (float16 overflows)",
            f"for _part in (getattr({{pipe}}.{c.target}, \"post_quant_conv\", None), {{pipe}}.{c.target}.decoder):",
            "    if _part is not None:  # the latents enter the float32 decoder cast to float32",
            "        _part.register_forward_pre_hook(",
            "            lambda _m, args: tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))",
        ]

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        return component_edit(self, c, site)


def upcast_decoding(vae: Any) -> None:
    """The latents cast to float32 as they enter the VAE's decoding modules (what pipeline_lines writes)."""
    import torch

    def to_float32(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    for name in DECODE_ENTRIES:
        part = getattr(vae, name, None)
        if isinstance(part, torch.nn.Module):
            part.register_forward_pre_hook(to_float32)
