"""DD120: a float64 tensor on Apple's MPS device, which holds no float64."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.machine.mps_expectations import FLOAT64_ERROR, NEVER
from dtype_doctor.records import Finding, LineageStep, OpCall, Remedy, TensorMeta, Trace
from dtype_doctor.rules._common import base_op, cast_remedies, describe, source_of, stage_of
from dtype_doctor.rules.base import Rule


def on_mps(t: TensorMeta) -> bool:
    return t.device.startswith("mps")


def _float64(t: TensorMeta) -> bool:
    return t.dtype in NEVER and on_mps(t)


def refuses(op: OpCall) -> bool:
    """Whether a real MPS device raises on this op: an operand or result float64 on mps."""
    return any(_float64(t) for t in (*op.operands, *op.outputs))


def _arrivals(trace: Trace, seen: set[str]) -> Iterator[Finding]:
    """A model input that reaches mps as float64: a real Mac refuses it at that copy (`x.to("mps")`),
    before any op, so the finding names that line; a cast after it still fails there."""
    for name, steps in trace.lineage.items():
        step = next((s for s in steps if s.dtype in NEVER and (s.device or "").startswith("mps")), None)
        if step is None or name in seen:
            continue
        seen.update((name, _copied(step.dtype, step.shape)))
        tensor = next((t for t in trace.inputs if t.name == name), None)
        yield RULE.finding(
            f"{name} reaches mps as {step.dtype} ({step.stage}): MPS has no {step.dtype} and refuses the copy",
            stage=step.stage,
            tensors=(tensor,) if tensor is not None else (),
            source=step.source,
            pytorch_error=FLOAT64_ERROR,
            remedies=_entry_remedies(name, steps, step),
        )


def _entry_remedies(name: str, steps: tuple[LineageStep, ...], copy: LineageStep) -> tuple[Remedy, ...]:
    """mps-float32 where the input became float64 (`torch.from_numpy`), then at its copy to mps: a cast
    after the copy comes too late, as the copy is what a Mac refuses. Read from the lineage, not the
    model's input, so the finding keeps its fix after a cast at the model call."""
    made = next((s for s in steps if s.dtype in NEVER), copy)
    to = "float32" if copy.dtype == "float64" else "complex64"
    places = dict.fromkeys(s.source for s in (made, copy) if s.source is not None)
    return tuple(Remedy("mps-float32", name, to, made.stage if where == made.source else copy.stage, where) for where in places)


_COPIES = frozenset({"aten._to_copy", "aten.copy_"})


def _copied(dtype: str | None, shape: tuple[int, ...] | None) -> str:
    return f"copy:{dtype}:{tuple(shape) if shape is not None else None}"


def _copy_onto_mps(op: OpCall) -> bool:
    """A copy from another device onto mps: `x.to(device)` of a CPU tensor (the script's, or model code's)."""
    return base_op(op.op) in _COPIES and any(not on_mps(o) for o in op.operands)


def _copy_finding(op: OpCall, t: TensorMeta) -> Finding:
    """A float64 copy onto mps that no model input's lineage names (the evaluation loop's `data.to(device)`):
    the copy is what a Mac refuses, so a cast where the tensor is made "in the model" would come too late.
    Said with its fix in words; the trace does not know the copy's line."""
    inside = f" in {op.module_type}" if op.module else ""
    return RULE.finding(
        f"a {t.dtype} tensor{inside} is copied to mps ({base_op(op.op).removeprefix('aten.')} from "
        f"{next(o.device for o in op.operands if not on_mps(o))}): MPS has no {t.dtype} and refuses the copy",
        module=op.module,
        module_type=op.module_type if op.module else None,
        op=op.op,
        stage="transfer",
        tensors=(t,),
        pytorch_error=FLOAT64_ERROR,
        hints=(f"cast it to {'float32' if t.dtype == 'float64' else 'complex64'} before its copy to mps "
               f"(x.to(torch.float32).to(device), or torch.from_numpy(a).float())",),
    )


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[str] = set()
    yield from _arrivals(trace, seen)
    for op in trace.ops:
        for t in (*op.operands, *op.outputs):
            key = t.name or t.origin or f"{base_op(op.op)}@{op.module}"
            if not _float64(t) or key in seen or (base_op(op.op) in _COPIES and _copied(t.dtype, t.shape) in seen):
                continue  # (a copy onto mps of what an input's arrival names: the next batch's `x.to(device)`)
            seen.add(key)
            if _copy_onto_mps(op):
                yield _copy_finding(op, t)
                continue
            where = f" in {op.module_type}" if op.module_type else ""
            yield RULE.finding(
                f"{describe(t)} is {t.dtype} on mps{where}: MPS has no {t.dtype} and refuses it "
                f"({base_op(op.op).removeprefix('aten.')})",
                module=op.module,
                module_type=op.module_type,
                op=op.op,
                stage=stage_of(trace, t, rejected=lambda d: d in NEVER),
                tensors=(t,),
                source=source_of(trace, t),
                pytorch_error=FLOAT64_ERROR,
                remedies=cast_remedies(trace, (t,), "float32" if t.dtype == "float64" else "complex64",
                                       lambda d: d in NEVER),
            )


RULE = Rule(
    code="DD120",
    name="float64-on-mps",
    severity="error",
    summary="A float64 (or complex128) tensor on Apple's MPS device, which has no 64-bit floating dtype.",
    why=(
        "Metal Performance Shaders has no float64. Moving a float64 tensor to mps, or making one there, raises "
        "TypeError, so a script that runs on CPU or CUDA (numpy arrays and Python floats are float64) fails at "
        "its first .to('mps') on a Mac."
    ),
    example=(
        "x = torch.from_numpy(np.ones(3))        # float64\n"
        "x.to('mps')\n"
        "TypeError: " + FLOAT64_ERROR
    ),
    fix="Cast to float32 where the float64 tensor enters, before its copy to mps (torch.from_numpy(a).to(torch.float32)).",
    fix_safety="mps-float32 (to float32, before the copy) and cast-inputs (a tensor made on mps, where it is made) are safe.",
    check=check,
    rejects=refuses,
    references=("torch/testing/_internal/common_mps.py (torch.double fails for every op)",
                "aten/src/ATen/native/mps/OperationUtils.mm getMPSDataType"),
    device_note="Judged for a trace whose tensors are on mps: a real Mac, or `--simulate --device mps`.",
)
