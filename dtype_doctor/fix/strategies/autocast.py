"""autocast: trace under torch.autocast with the half dtype the mismatch involves; weights stay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, half_dtype
from dtype_doctor.records import HALF, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Autocast(
    Strategy, name="autocast", applicability=SAFE, rank=30,
    summary="run the forward under torch.autocast in the half dtype the mismatch involves",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        to = remedies[0].to
        scaler = " (with a torch.amp.GradScaler when training)" if to == "float16" else ""
        return f"run the forward under torch.autocast(dtype=torch.{to}){scaler}; weights stay as they are"

    def describe(self, c: Change) -> str:
        return f"run the forward under torch.autocast(dtype=torch.{c.to})"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if pipeline.autocast:
            raise Skip(f"the forward already runs under autocast ({pipeline.autocast})")
        halves = [r.to for r in self.remedies(report, ctx) if r.to in HALF]
        if not halves:
            raise Skip("no half-precision operand in the mismatches: autocast would not change them")
        return (Change(self.name, "forward", max(set(halves), key=halves.count), None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        return pipeline.with_(request=pipeline.request.with_(autocast=changes[0].to))

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        file = site.call if site.run else site.script
        if file is None:
            return []
        line = site.call_line if site.run else None
        # fix --run for a GPU without bfloat16 tensor cores (a T4): the script's own bfloat16 autocast runs float16.
        retarget = [Attempt(f, cm.RetargetAutocast("bfloat16", c.to)) for f in site.user_files] if (
            site.run and site.bf16 is False and c.to == "float16") else []
        return [*retarget, Attempt(file, cm.WrapForwardInAutocast(device_type=site.device_type, dtype=c.to, line=line,
                                                                 variable=site.model_name if site.run else None))]

    fix_module = ModulePart(
        function="autocast_context",
        role="context",
        order=50,
        why=(
            "The forward runs under torch.autocast: weights stay float32 (the master copy an\n"
            "optimizer needs) and autocast runs each op in the dtype it is safe in."
        ),
        usage="with apply_fix(model, batch):\n    outputs = model(**batch)",
        source='''

def autocast_context(model, batch):
    """Return the torch.autocast context to run the forward of `model` on `batch` in."""
    device_type = {device_type_expr}
    return torch.autocast(device_type=device_type, dtype=torch.{dtype})
''',
    )

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        parts.setdefault(self.name, {"dtype": c.to, "device_type": site.device_type})

    def scan_options(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"--autocast": params["dtype"]}

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """``dtype`` (float16), ``device_type`` (default: the model's device type)."""
        import re

        dtype = half_dtype(params, "autocast runs in")
        device_type = params.get("device_type")
        if device_type is not None and not re.fullmatch(r"[a-z_]+", str(device_type)):
            raise Skip(f"bad device_type {device_type!r}")
        return {
            "dtype": dtype,
            "device_type_expr": f'"{device_type}"' if device_type else "_model_dtype_and_device(model)[1].type",
        }
