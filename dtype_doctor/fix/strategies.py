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

from dtype_doctor.fix.outcome import Change, Step
from dtype_doctor.records import HALF, Finding, Report, SourceLoc, TraceRequest
from dtype_doctor.rules._common import CLASS_LOSS, base_op, input_name
from dtype_doctor.trace.recorder import dtype_name

FP16_MAX = 65504.0


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


class Strategy(ABC):
    name: ClassVar[str]
    applicability: ClassVar[str]  # safe | unsafe
    addresses: ClassVar[frozenset[str]]  # rule codes it can resolve

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
        return [f for f in report.at_or_above(ctx.fail_on) if f.code in self.addresses]

    @abstractmethod
    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]: ...

    @abstractmethod
    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline: ...


def describe(c: Change) -> str:
    verb = {
        "cast-input": f"cast {c.target} {c.before} → {c.to}",
        "convert-model": f"convert the model {c.before} → {c.to} (declared fp32 modules and buffers kept)",
        "autocast": f"run the forward under torch.autocast(dtype=torch.{c.to})",
        "move-input": f"move {c.target} {c.before} → {c.to}",
        "trainable-fp32": f"keep the {c.target} parameters in float32 (were {c.before})",
    }
    return verb.get(c.kind, f"{c.kind} {c.target} → {c.to}")


def _lineage_stage(report: Report, name: str) -> tuple[str | None, SourceLoc | None]:
    from dtype_doctor.rules._common import source_of, stage_of

    t = report.trace.input(name) if report.trace else None
    if t is None:
        return None, None
    return stage_of(report.trace, t), source_of(report.trace, t)


class CastInputs(Strategy):
    """Cast floating inputs to their consumer's dtype, ids and class labels to int64."""

    name = "cast-inputs"
    applicability = "safe"
    addresses = frozenset({"DD101", "DD103", "DD104", "DD105", "DD106", "DD108"})

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        wanted: dict[str, str] = {}
        model_dtype = report.target.model_dtype or "float32"
        for f in self.relevant(report, ctx):
            for name, dtype in _wanted_casts(f, model_dtype):
                if name in pipeline.inputs and isinstance(pipeline.inputs[name], torch.Tensor):
                    wanted.setdefault(name, dtype)
        changes = []
        for name, dtype in wanted.items():
            current = dtype_name(pipeline.inputs[name].dtype)
            if current == dtype:
                continue
            stage, source = _lineage_stage(report, name)
            changes.append(Change("cast-input", name, dtype, current, stage, source))
        if not changes:
            raise Skip("no model input carries the offending dtype (it comes from model code or weights)")
        return tuple(changes)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = inputs[c.target].to(getattr(torch, c.to))
        return pipeline.with_(inputs=inputs)


def _wanted_casts(f: Finding, model_dtype: str) -> list[tuple[str, str]]:
    """(input name, dtype it should have) for the inputs a finding blames."""
    out: list[tuple[str, str]] = []
    inputs = [(input_name(t), t) for t in f.tensors]
    inputs = [(n, t) for n, t in inputs if n is not None]
    if f.code == "DD101":
        # The consumer's dtype: a weight's, else an operand the model made (an index_put
        # destination, an activation), else the model's.
        weights = [t for t in f.tensors if t.role in ("weight", "bias", "buffer")]
        made = [t for t in f.tensors if input_name(t) is None and t.is_floating]
        expected = (weights or made)[0].dtype if (weights or made) else model_dtype
        out += [(n, expected) for n, t in inputs if t.role not in ("weight", "bias", "buffer") and t.dtype != expected]
    elif f.code == "DD103":
        out += [(n, "int64") for n, t in inputs if t.role == "index"]
    elif f.code == "DD104":
        pred = next((t for t in f.tensors if t.role == "input" and t.is_floating), None)
        for n, t in inputs:
            if t.role == "target":
                is_class = f.op is not None and base_op(f.op) in CLASS_LOSS
                out.append((n, "int64" if is_class else (pred.dtype if pred else model_dtype)))
    elif f.code == "DD105":
        out += [(n, model_dtype if model_dtype != "float64" else "float32") for n, t in inputs if t.dtype == "float64"]
    elif f.code == "DD106":
        masks = [(n, t) for n, t in inputs if t.role == "mask"]
        query = next((t for t in f.tensors if t.role != "mask"), None)
        out += [(n, "bool" if not t.is_floating else (query.dtype if query else model_dtype)) for n, t in masks]
    elif f.code == "DD108" and len(f.tensors) == 2:
        src, dst = f.tensors
        if (n := input_name(src)) is not None:
            out.append((n, dst.dtype))
    return out


class Autocast(Strategy):
    """Trace under torch.autocast with the half dtype the mismatch involves; weights stay."""

    name = "autocast"
    applicability = "safe"
    addresses = frozenset({"DD101"})

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        if pipeline.autocast:
            raise Skip(f"the forward already runs under autocast ({pipeline.autocast})")
        halves = [t.dtype for f in self.relevant(report, ctx) for t in f.tensors if t.dtype in HALF]
        if not halves:
            raise Skip("no half-precision operand in the mismatches: autocast would not change them")
        return (Change("autocast", "forward", max(set(halves), key=halves.count), None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        return pipeline.with_(request=pipeline.request.with_(autocast=changes[0].to))


class HalfModel(Strategy):
    """Convert the model to a half dtype, keeping declared fp32 modules and fp32 buffers."""

    name = "half-model"
    applicability = "unsafe"
    addresses = frozenset({"DD101", "DD102", "DD109"})

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        relevant = self.relevant(report, ctx)
        if not relevant:
            raise Skip("no finding that converting the model would resolve")
        halves = [t.dtype for f in relevant for t in f.tensors if t.dtype in HALF]
        main = report.target.model_dtype
        target = max(set(halves), key=halves.count) if halves else (main if main in HALF else "float16")
        if target == main and not any(f.code in ("DD102", "DD109") for f in relevant):
            raise Skip(f"the model is already {main}: converting it again changes nothing")
        if target == "float16" and ctx.overflow and not ctx.force:
            worst = max(ctx.overflow.items(), key=lambda kv: kv[1])
            if worst[1] > FP16_MAX:
                raise Skip(
                    f"refused: {worst[0] or 'the model'} produces |x| = {worst[1]:.4g} > {FP16_MAX:.0f} (float16 max) "
                    "in the fp32 reference; use bfloat16, autocast, or --force"
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


class ToDevice(Strategy):
    """Move stray inputs to the model's device."""

    name = "to-device"
    applicability = "safe"
    addresses = frozenset({"DD201"})

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        home = _model_device(report)
        changes, code_made = [], []
        for f in self.relevant(report, ctx):
            for t in f.tensors:
                if t.device == home:
                    continue
                name = input_name(t)
                if name is not None and name in pipeline.inputs:
                    stage, source = _lineage_stage(report, name)
                    changes.append(Change("move-input", name, home, t.device, stage, source))
                else:
                    code_made.append(f"{f.module or 'the model'} ({t.origin or 'created in forward'})")
        if not changes:
            reason = "the stray tensor is created in model code: " + ", ".join(code_made) if code_made else "no input is on another device"
            raise Skip(reason + "; it needs device= where it is created")
        return tuple({c.target: c for c in changes}.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        inputs = dict(pipeline.inputs)
        for c in changes:
            inputs[c.target] = _move(inputs[c.target], c.to, simulated=pipeline.simulate)
        return pipeline.with_(inputs=inputs)


def _model_device(report: Report) -> str:
    devices = [p.device for p in report.trace.model.parameters] if report.trace else []
    return max(set(devices), key=devices.count) if devices else report.target.device


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
    addresses = frozenset({"DD110", "DD401"})

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


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (ToDevice(), CastInputs(), Autocast(), Fp32Trainable(), HalfModel())}
# `auto` tries them in this order: least invasive first.
AUTO_ORDER = ("to-device", "cast-inputs", "autocast", "fp32-trainable", "half-model")
NAMES = (*STRATEGIES, "auto")
