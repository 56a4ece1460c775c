"""half-model: convert the model to a half dtype, keeping declared fp32 modules and fp32 buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import UNSAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, half_dtype, one_attempt
from dtype_doctor.records import FP16_MAX, HALF, Remedy, Report

if TYPE_CHECKING:
    import torch

    from dtype_doctor.fix.patches import Attempt


class HalfModel(
    Strategy, name="half-model", applicability=UNSAFE, rank=60, json_kind="convert-model",
    summary="convert the whole model to a half dtype (unsafe: changes weight precision)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        to = remedies[0].to
        return (
            f"convert the model to {to} at load (from_pretrained(..., dtype=torch.{to})), not with .to() afterwards: "
            "that keeps its declared fp32 modules and fp32 buffers"
        )

    def describe(self, c: Change) -> str:
        return f"convert the model {c.before} → {c.to} (declared fp32 modules and buffers kept)"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        remedies = self.remedies(report, ctx)
        if not remedies:
            raise Skip("no finding that converting the model would resolve")
        halves = [r.to for r in remedies if r.to in HALF]
        main = report.target.model_dtype
        target = max(set(halves), key=halves.count) if halves else (main if main in HALF else "float16")
        # A remedy naming a module says that module is off; one naming the model alone says
        # the dtype is, and converting to the dtype it already has changes nothing.
        if target == main and all(r.target == "model" for r in remedies):
            raise Skip(f"the model is already {main}: converting it again changes nothing")
        if target == "float16" and ctx.overflow and not ctx.force:
            worst = max(ctx.overflow.items(), key=lambda kv: kv[1])
            if worst[1] > FP16_MAX:
                raise Skip(
                    f"refused: {worst[0] or 'the model'} produces |x| = {worst[1]:.4g} > {FP16_MAX:.0f} (float16 max) "
                    "in the fp32 reference; use bfloat16, autocast, keep-fp32 (the smallest float32 set), or --force"
                )
        return (Change(self.name, "model", target, main),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        model = copy.deepcopy(pipeline.model)
        convert_keeping_fp32(model, getattr(torch, changes[0].to))
        return pipeline.with_(model=model)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix.codemods import model as cm

        mods = [cm.SetLoadDtype(c.to), cm.RemoveModelConversion()]
        return one_attempt(site.conversion_file if site.run else site.script, mods) + site.retarget_conversion(c)

    fix_module = ModulePart(
        function="half_model",
        role="model",
        order=20,
        why=(
            "The model is converted to half precision to match its inputs and save memory; the\n"
            "modules the model declares must stay float32 (_keep_in_fp32_modules) are kept float32.\n"
            "Unsafe: half precision can overflow or lose accuracy — check the parity numbers."
        ),
        usage="model = apply_fix(model, batch)\noutputs = model(**batch)",
        source='''

def half_model(model, batch):
    """Convert `model` to {dtype} in place, keeping its declared fp32 modules float32; return it."""
    model.to(torch.{dtype})
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, module in model.named_modules():
        if any(part in name.split(".") for part in keep):
            module.float()
    return model
''',
    )

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        parts.setdefault(self.name, {"dtype": c.to})

    def scan_options(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"--dtype": params["dtype"]}

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """``dtype`` (float16)."""
        return {"dtype": half_dtype(params, "half-model converts to")}


def convert_keeping_fp32(model: "torch.nn.Module", dtype: "torch.dtype") -> None:
    """What from_pretrained(dtype=...) does: every persistent floating tensor in `dtype` but
    those transformers' dtype plan keeps (fp32 modules); buffers computed at init stay."""
    import torch

    from dtype_doctor.load.fake_model import dtype_plan

    override = dtype_plan(model, dtype)
    persistent = set(model.state_dict().keys())
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point() and name in persistent:
                t.data = t.data.to(override(name) or dtype)
