"""Fix strategies: each plans Changes from a Report, then applies them to a Pipeline copy.

A strategy never edits the pipeline it is given: it returns a new one (sharing what it did
not change), so rolling back a fix is dropping the new pipeline.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch

from dtype_doctor.fix.outcome import Change, Step, describe
from dtype_doctor.records import FP16_MAX, HALF, main_dtype_of, Finding, Remedy, Report, TraceRequest
from dtype_doctor.trace.recorder import device_name, dtype_name



@dataclass
class Pipeline:
    """What a trace runs: the working copy a fix changes (model, batch, and how it is traced)."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    request: TraceRequest = field(default_factory=TraceRequest)

    @property
    def autocast(self) -> str | None:
        return self.request.autocast

    @property
    def simulate(self) -> bool:
        return self.request.simulate

    def with_(self, **changes: Any) -> "Pipeline":
        return replace(self, **changes)


class Skip(Exception):
    """Raised inside plan() to say the strategy does not apply, with the reason."""


@dataclass(frozen=True)
class Context:
    fail_on: str = "error"
    unsafe: bool = False  # --unsafe-fixes, or the strategy asked for by name
    force: bool = False  # apply half-model despite overflow evidence
    overflow: dict[str, float] | None = None  # module → max |value| in the fp32 reference
    requested: str | None = None  # the strategy asked for by name (None under auto)


class Strategy(ABC):
    name: ClassVar[str]
    applicability: ClassVar[str]  # safe | unsafe
    # Asked for by name, it runs even when the scan is clean: a conversion the user wants.
    on_request: ClassVar[bool] = False

    def run(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Pipeline, Step]:
        if self.applicability == "unsafe" and not ctx.unsafe:
            return pipeline, Step(self.name, "skipped", "changes weight precision; pass --unsafe-fixes or --strategy " + self.name)
        try:
            changes = self.plan(pipeline, report, ctx)
        except Skip as why:
            return pipeline, Step(self.name, "skipped", str(why))
        try:
            new = self.apply(pipeline, changes)
        except Exception as exc:  # noqa: BLE001 - a failing fix is a result, not a crash
            return pipeline, Step(self.name, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0], changes)
        return new, Step(self.name, "applied", "; ".join(describe(c) for c in changes), changes)

    def relevant(self, report: Report, ctx: Context) -> list[Finding]:
        """The findings at or above --fail-on whose rule offers this strategy as a remedy."""
        return [f for f in report.at_or_above(ctx.fail_on) if any(r.strategy == self.name for r in f.remedies)]

    def remedies(self, report: Report, ctx: Context) -> list[Remedy]:
        return [r for f in self.relevant(report, ctx) for r in f.remedies if r.strategy == self.name]

    @abstractmethod
    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]: ...

    @abstractmethod
    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline: ...


class CastInputs(Strategy):
    """Cast model inputs to the dtype the rules say their consumer needs."""

    name = "cast-inputs"
    applicability = "safe"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        wanted: dict[str, Remedy] = {}
        for r in self.remedies(report, ctx):
            if isinstance(pipeline.inputs.get(r.target), torch.Tensor):
                wanted.setdefault(r.target, r)
        changes = []
        for name, r in wanted.items():
            current = dtype_name(pipeline.inputs[name].dtype)
            if current != r.to:
                changes.append(Change("cast-input", name, r.to, current, r.stage, r.source))
        if not changes:
            made = sorted({r.target for r in self.remedies(report, ctx) if r.target not in pipeline.inputs})
            where = f": made in model code by {', '.join(made)}" if made else " (it comes from model code or weights)"
            raise Skip("no model input carries the offending dtype" + where)
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = inputs[c.target].to(getattr(torch, c.to))
        return pipeline.with_(inputs=inputs)


class Autocast(Strategy):
    """Trace under torch.autocast with the half dtype the mismatch involves; weights stay."""

    name = "autocast"
    applicability = "safe"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if pipeline.autocast:
            raise Skip(f"the forward already runs under autocast ({pipeline.autocast})")
        halves = [r.to for r in self.remedies(report, ctx) if r.to in HALF]
        if not halves:
            raise Skip("no half-precision operand in the mismatches: autocast would not change them")
        return (Change("autocast", "forward", max(set(halves), key=halves.count), None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        return pipeline.with_(request=pipeline.request.with_(autocast=changes[0].to))


class HalfModel(Strategy):
    """Convert the model to a half dtype, keeping declared fp32 modules and fp32 buffers."""

    name = "half-model"
    applicability = "unsafe"

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
        return (Change("convert-model", "model", target, main),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        dtype = getattr(torch, changes[0].to)
        model = copy.deepcopy(pipeline.model)
        convert_keeping_fp32(model, dtype)
        return pipeline.with_(model=model)


def convert_keeping_fp32(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """What from_pretrained(dtype=...) does: every persistent floating tensor in `dtype` but
    those transformers' dtype plan keeps (fp32 modules); buffers computed at init stay."""
    from dtype_doctor.load.model import dtype_plan

    override = dtype_plan(model, dtype)
    persistent = set(model.state_dict().keys())
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point() and name in persistent:
                t.data = t.data.to(override(name) or dtype)


class KeepFp32(Strategy):
    """Keep the smallest set of modules float32 that makes the half model finite and close to
    float32 (dtype_doctor.fix.keep_fp32): on a float16 model whose findings ask for it, or
    asked for by name on a float32 model, which it converts to float16 keeping that set."""

    name = "keep-fp32"
    applicability = "safe"
    on_request = True

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if pipeline.simulate:
            raise Skip("finding the modules to keep needs real values; it does not run under --simulate")
        if pipeline.autocast:
            raise Skip(f"the forward runs under autocast ({pipeline.autocast}), which picks each op's dtype whatever the weights'")
        main = _main_dtype(pipeline.model)
        if main not in HALF and ctx.requested != self.name:
            raise Skip(f"the model is {main}: nothing runs in half precision (--strategy keep-fp32 converts it to float16)")
        if main not in HALF and main != "float32":
            raise Skip(f"the model is {main}; keep-fp32 converts float32 models to float16")
        if main in HALF and not self.remedies(report, ctx) and ctx.requested != self.name:
            raise Skip("no finding asks for modules in float32")
        target = main if main in HALF else "float16"
        from dtype_doctor.fix.keep_fp32 import minimal_fp32_set

        found = minimal_fp32_set(pipeline.model, pipeline.inputs, dtype=getattr(torch, target))
        if not found.needed:
            raise Skip(found.reason)
        if not found.verified:
            raise Skip("no set of modules kept float32 works: " + found.reason)
        return (
            Change("keep-fp32", "model", target, main),
            *(Change("keep-fp32", name, "float32", target) for name in found.modules),
        )

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        from dtype_doctor.fix.keep_fp32 import apply_keep_fp32

        dtype = getattr(torch, next(c.to for c in changes if c.target == "model"))
        model = copy.deepcopy(pipeline.model)
        apply_keep_fp32(model, [c.target for c in changes if c.target != "model"], dtype)
        return pipeline.with_(model=model)


def _main_dtype(model: torch.nn.Module) -> str:
    """The dtype most of the model's floating parameter elements have (float32 with none)."""
    return main_dtype_of((dtype_name(p.dtype), p.numel()) for p in model.parameters()) or "float32"


class ToDevice(Strategy):
    """Move stray inputs to the model's device."""

    name = "to-device"
    applicability = "safe"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        remedies = self.remedies(report, ctx)
        changes = [
            Change("move-input", r.target, r.to, device_name(pipeline.inputs[r.target].device), r.stage, r.source)
            for r in remedies
            if isinstance(pipeline.inputs.get(r.target), torch.Tensor)
        ]
        if not changes:
            code_made = sorted({r.target for r in remedies if r.target not in pipeline.inputs})
            reason = "the stray tensor is created in model code: " + ", ".join(code_made) if code_made else "no input is on another device"
            raise Skip(reason + "; it needs device= where it is created")
        return tuple({c.target: c for c in changes}.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = _move(inputs[c.target], c.to, simulated=pipeline.simulate)
        return pipeline.with_(inputs=inputs)


def _move(t: torch.Tensor, device: str, *, simulated: bool) -> torch.Tensor:
    """t on `device`; in a simulated pipeline a fake tensor there (the target may not exist)."""
    if not simulated:
        return t.to(device)
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from dtype_doctor.trace.engine import fake_like

    mode = t.fake_mode if isinstance(t, FakeTensor) else FakeTensorMode(allow_non_fake_inputs=True)
    return fake_like(mode, t, device)


class Fp32Trainable(Strategy):
    """Keep trainable parameters in float32 (master weights) for AMP + GradScaler."""

    name = "fp32-trainable"
    applicability = "safe"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if not self.relevant(report, ctx):
            raise Skip("no half-precision trainable parameters in a training trace")
        half = sorted({p.dtype for p in report.trace.model.parameters if p.requires_grad and p.dtype in HALF})
        changes = [Change("trainable-fp32", "trainable", "float32", ",".join(half))]
        if not pipeline.autocast:
            # fp32 trainable weights beside half frozen ones only meet cleanly under autocast.
            changes.append(Change("autocast", "forward", half[0] if half else "bfloat16", None))
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        model = copy.deepcopy(pipeline.model)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad and p.is_floating_point():
                    p.data = p.data.float()
        autocast = next((c.to for c in changes if c.kind == "autocast"), pipeline.autocast)
        return pipeline.with_(model=model, request=pipeline.request.with_(autocast=autocast))


STRATEGIES: dict[str, Strategy] = {
    s.name: s for s in (ToDevice(), CastInputs(), Autocast(), Fp32Trainable(), KeepFp32(), HalfModel())
}
# `auto` tries them in this order: least invasive first. keep-fp32 changes the precision of a
# few modules (weights stay float32 or go to the half dtype the model already runs in), after
# the fixes that touch no weights and before converting the whole model.
AUTO_ORDER = ("to-device", "cast-inputs", "autocast", "fp32-trainable", "keep-fp32", "half-model")
NAMES = (*STRATEGIES, "auto")
