"""fp32-trainable: keep trainable parameters in float32 (master weights) for AMP + GradScaler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.autocast import Autocast
from dtype_doctor.fix.strategies.base import SAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, one_attempt, resolve
from dtype_doctor.records import HALF, Finding, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Fp32Trainable(
    Strategy, name="fp32-trainable", applicability=SAFE, rank=40, json_kind="trainable-fp32",
    summary="keep trainable parameters float32 (master weights) and run the forward under autocast",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        return "keep trainable parameters in float32 and run the forward under torch.autocast"

    def describe(self, c: Change) -> str:
        return f"keep the {c.target} parameters in float32 (were {c.before})"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if not self.relevant(report, ctx):
            raise Skip("no half-precision trainable parameters in a training trace")
        half = sorted({p.dtype for p in report.trace.model.parameters if p.requires_grad and p.dtype in HALF})
        changes = [Change(self.name, "trainable", "float32", ",".join(half))]
        if not pipeline.autocast:
            # fp32 trainable weights beside half frozen ones only meet cleanly under autocast.
            changes.append(Change(Autocast.name, "forward", half[0] if half else "bfloat16", None))
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        model = copy.deepcopy(pipeline.model)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad and p.is_floating_point():
                    p.data = p.data.float()
        new = pipeline.with_(model=model)
        # The autocast change it plans is the autocast strategy's to apply.
        autocast = tuple(c for c in changes if c.kind == Autocast.name)
        return Autocast().apply(new, autocast) if autocast else new

    fix_module = ModulePart(
        function="fp32_trainable",
        role="model",
        order=25,
        why=(
            "Trainable parameters are kept in float32 so the optimizer state and the gradients\n"
            "torch.amp.GradScaler unscales are float32; frozen weights keep their half dtype."
        ),
        usage="model = apply_fix(model, batch)\noptimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)",
        source='''

def fp32_trainable(model, batch):
    """Make the trainable parameters of `model` float32 in place (frozen ones keep their dtype); return it."""
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
    return model
''',
    )

    def scan_options(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"--dtype": "float32"}

    def script_changes(self, finding: Finding, remedies: Sequence[Remedy], report: Report, ctx: Context) -> tuple[Change, ...]:
        if not remedies:
            raise Skip(f"{finding.code} names no fp32-trainable remedy")
        half = sorted({p.dtype for p in report.trace.model.parameters if p.requires_grad and p.dtype in HALF}) if report.trace else []
        return (Change(self.name, "trainable", "float32", ",".join(half) or None, "model-loading", finding.source),)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        """In auto's order: undo what made the weights half (the conversion, or from_pretrained's
        dtype=); else keep the trainable ones float32 right after it; else, where the GPU runs
        bfloat16, mixed precision in bfloat16, which needs no GradScaler."""
        from dtype_doctor.fix import codemods as cm
        from dtype_doctor.fix.patches import Attempt

        # The script converted the whole (trainable) model to half: keep it as loaded.
        mods = [cm.RemoveModelConversion(from_dtype=d) for d in ("float16", "bfloat16")]
        if not site.run:
            return one_attempt(site.script, mods)
        where, line = site.conversion_file, site.conversion.line if site.converted and site.conversion else None
        # The conversion the run saw, on its line; where it saw none, any conversion of the loaded model.
        attempts = one_attempt(where, [cm.RemoveModelConversion(lines=[line])]) if line else [a for m in mods for a in one_attempt(where, [m])]
        if line is None and c.source is not None:  # the finding's own line (`unet.to(device, dtype=weight_dtype)`:
            # a model of several, whose conversion the run names by the finding, not as the model's)
            attempts = one_attempt(resolve(c.source), [cm.RemoveModelConversion(lines=[c.source.line])]) + attempts
        attempts += site.retarget_conversion(c)
        attempts += [Attempt(f, cm.DropLoadDtype()) for f in site.user_files]
        if line is not None and where is not None:
            attempts.append(Attempt(where, cm.KeepTrainableFloat32(line)))
        else:
            attempts += [Attempt(f, cm.KeepTrainableFloat32()) for f in site.user_files]
        if site.bf16:
            attempts += [Attempt(f, cm.SetMixedPrecision()) for f in site.user_files]
        return attempts
