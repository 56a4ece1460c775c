"""What several rules need: op families, where a dtype came from, the fixes to offer."""

from __future__ import annotations

from typing import Callable, Iterable

from dtype_doctor.ops.operands import required_dtype
from dtype_doctor.ops.families import (  # noqa: F401 - the rules read the op families from here
    ATTENTION, CLASS_LOSS, CONV, EMBEDDING, INDEX_PUT, LOSSES, MATMUL, NORM, VALUE_LOSS, base_op, family,
)
from dtype_doctor.records import FLOATING, HALF, INTEGER, OpCall, Remedy, SourceLoc, TensorMeta, Trace, in_modules

def kernel_dtype(op: OpCall, t: TensorMeta) -> str:
    """The dtype `t` has when the kernel runs.

    Aten-level ops are recorded after autocast's casts. Function-level ops (conv, SDPA) are
    recorded before them: autocast casts every floating operand except float64 to its dtype
    for these ops, and leaves float64 and integer operands as they are.
    """
    if (
        op.level == "function"
        and op.autocast
        and t.is_floating
        and t.dtype != "float64"
        and family(op.op) in ("conv", "attention")
    ):
        return op.autocast
    return t.dtype


def refused(op: OpCall) -> bool:
    """Whether the kernel refused `op`: PyTorch raised on it, or, in a simulated trace, the
    probe of the real kernel did. Rules explain refusals; they never invent one."""
    return op.error is not None


def reraised(trace: Trace, op: OpCall) -> bool:
    """Whether `op`'s error is an inner op's error passing through it (F.cross_entropy
    around aten.nll_loss_forward): one refusal, reported once, at the inner op."""
    return op.level != "aten" and any(
        o.error == op.error and o.level == "aten" and o.index < op.index for o in trace.ops
    )


def family_ops(trace: Trace, family: frozenset[str], *, phase: str | None = "forward") -> list[OpCall]:
    return [op for op in trace.ops if base_op(op.op) in family and (phase is None or op.phase == phase)]


def main_dtype(trace: Trace) -> str | None:
    return trace.model.main_dtype


def input_name(t: TensorMeta) -> str | None:
    if t.origin and t.origin.startswith("input:"):
        return t.origin.removeprefix("input:")
    return None


def stage_of(trace: Trace, t: TensorMeta, *, what: str = "dtype", rejected: Callable[[str], bool] | None = None) -> str:
    """The pipeline stage where `t`'s dtype (or device) went wrong: the first stage at which it
    became one its consumer rejects (`rejected`; by default: anything but its final value).

    Later stages that only change the width (float64 → float32) are shown in the lineage,
    not blamed: float input_ids made in preprocess and narrowed by the formatter are
    preprocess's; uint8 pixels made float32 by the processor are the processor's.
    """
    origin = t.origin or ""
    if origin.startswith(("param:", "buffer:")):
        return "model-loading"
    name = input_name(t)
    if name is None:
        return "model-code"
    steps = trace.lineage.get(name, ())
    boundary = trace.input(name)
    final = getattr(boundary, what, None) if boundary else getattr(t, what)
    if boundary is not None and getattr(t, what) != final:
        return "model-code"  # the model changed it after the boundary
    if not steps:
        return "collator"  # API use: the caller built the batch
    values = [(step.stage, getattr(step, what)) for step in steps if getattr(step, what) is not None]
    wrong = rejected or (lambda v: v == final)
    i = len(values) - 1
    while i > 0 and wrong(values[i - 1][1]) and _same_kind(values[i - 1][1], values[i][1], what):
        i -= 1
    stage = values[i][0] if values else None
    if stage in (None, "model-boundary"):
        return "transfer" if what == "device" else "collator"
    return stage


def _same_kind(a: str, b: str, what: str) -> bool:
    """Floating to floating (or integer to integer) is a change of width; a device is a kind of its own."""
    if what != "dtype":
        return a == b
    kind = lambda d: "floating" if d in FLOATING else "integer" if d in INTEGER else d  # noqa: E731
    return kind(a) == kind(b)


def source_of(trace: Trace, t: TensorMeta) -> SourceLoc | None:
    name = input_name(t)
    if name is None:
        return None
    if name in trace.sources:
        return trace.sources[name]
    for step in trace.lineage.get(name, ()):
        if step.source is not None and step.dtype == t.dtype:
            return step.source
    return None


def required_of(op: OpCall, t: TensorMeta, anchor: str | None) -> str:
    """The dtype operand `t` of `op` must have: operands.required_dtype with the op's own facts
    (a loss target's from the prediction and the loss; anything else's from `anchor`)."""
    pred = next((o for o in op.operands if o.role == "input" and o.is_floating and o is not t), None)
    if t.role == "target":
        return required_dtype("target", t.dtype, anchor=pred.dtype if pred else anchor, class_target=base_op(op.op) in CLASS_LOSS)
    return required_dtype(t.role, t.dtype, anchor=anchor, query=pred.dtype if pred else anchor)


def consumer(trace: Trace, name: str) -> tuple[OpCall, TensorMeta] | None:
    """The first forward op that takes model input `name` in a role that sets its dtype (an
    index, a loss target, a mask), with the operand; None when it is only ever data."""
    for op in trace.ops:
        if op.phase != "forward":
            continue
        for t in op.operands:
            if t.role in ("index", "target", "mask") and input_name(t) == name:
                return op, t
    return None


def describe(t: TensorMeta) -> str:
    name = t.name or input_name(t)
    if name:
        return name
    if t.origin and t.origin.startswith("created:"):
        # "created:aten.arange.default@positions": made in forward, e.g. without device=
        op = t.origin.removeprefix("created:").split("@", 1)[0]
        return f"a tensor from {base_op(op).removeprefix('aten.')}"
    return t.role


def keep_fp32(trace: Trace, name: str) -> bool:
    """True when `name` lies in a module the model declares fp32 (_keep_in_fp32_modules)."""
    return in_modules(trace.model.keep_in_fp32_modules, name)


def cast_remedies(
    trace: Trace,
    tensors: Iterable[TensorMeta],
    to: Callable[[TensorMeta], str] | str,
    rejected: Callable[[str], bool] | None = None,
) -> list[Remedy]:
    """cast-inputs remedies for those of `tensors` not already in their dtype: a model input by
    its name; a tensor made in forward by its origin ("created:OP@MODULE"), cast where it is made.
    The remedy's stage is where the dtype went wrong (`rejected` as for stage_of; by default
    any dtype but the one wanted)."""
    out = []
    for t in tensors:
        dtype = to if isinstance(to, str) else to(t)
        name = input_name(t) or (t.origin if t.origin and t.origin.startswith("created:") else None)
        if name is not None and t.dtype != dtype:
            wrong = rejected or (lambda d, dtype=dtype: d != dtype)
            out.append(Remedy("cast-inputs", name, dtype, stage_of(trace, t, rejected=wrong), source_of(trace, t)))
    return out


def device_remedies(trace: Trace, tensors: Iterable[TensorMeta], device: str) -> list[Remedy]:
    """to-device remedies for those of `tensors` elsewhere than `device`: a model input by its
    name; a tensor made in forward by its origin ("created:OP@MODULE"), which needs device= there."""
    return [
        Remedy("to-device", input_name(t) or t.origin or t.name or t.role, device, stage_of(trace, t, what="device"), source_of(trace, t))
        for t in tensors
        if t.device != device
    ]


def autocast_remedy(dtype: str) -> Remedy:
    return Remedy("autocast", "forward", dtype)


def half_model_remedy(dtype: str, target: str = "model") -> Remedy:
    """Convert the model to `dtype`; `target` names the module that is off, "model" when none is."""
    return Remedy("half-model", target or "model", dtype, "model-loading")


FP32_TRAINABLE = Remedy("fp32-trainable", "trainable", "float32", "model-loading")


def is_half(dtype: str) -> bool:
    return dtype in HALF
