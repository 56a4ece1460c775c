"""DD121: an op that Apple's MPS backend does not implement for an operand's dtype."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.machine.mps_expectations import FALLBACK_ENV, NEVER, expectations
from dtype_doctor.records import Finding, OpCall, TensorMeta, Trace
from dtype_doctor.rules._common import autocast_remedy, base_op, describe, source_of, stage_of
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import data_operands
from dtype_doctor.rules.dd120_float64_on_mps import on_mps


def _data(op: OpCall) -> tuple[TensorMeta, ...]:
    """The operands whose dtype is the op's, as common_mps.py's dtypes are (its OpInfo sample's input):
    trace.verdicts.data_operands, not an index, mask or target (max_pool2d's backward takes int64 indices
    for every float pool); a factory (logspace) has no operands: its result's dtype."""
    return data_operands(op.operands) or op.operands or op.outputs


def refusal(op: OpCall, macos: tuple[int, int] | None = None) -> tuple[str, str] | None:
    """(dtype, why) for the first mps operand of `op` that MPS refuses on this macOS (float64 is DD120's)."""
    version = macos or expectations().min_macos
    for t in _data(op):
        if on_mps(t) and t.dtype not in NEVER:
            why = expectations().refused_aten(op.op, t.dtype, version)
            if why is not None:
                return t.dtype, why
    return None


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple[str, str]] = set()
    for op in trace.ops:
        found = refusal(op, trace.macos)
        if found is None or (base_op(op.op), found[0]) in seen:
            continue
        dtype, why = found
        seen.add((base_op(op.op), dtype))
        off = next(t for t in _data(op) if t.dtype == dtype and on_mps(t))
        where = f" in {op.module_type}" if op.module_type else ""
        version = trace.macos or expectations().min_macos
        yield RULE.finding(
            f"{base_op(op.op).removeprefix('aten.')}{where} has no MPS kernel for {dtype} on macOS "
            f"{version[0]}.{version[1]} ({describe(off)}): {why}",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage_of(trace, off),
            tensors=(off,),
            source=source_of(trace, off),
            hints=(_hint(dtype),),
        )


def _hint(dtype: str):
    """bfloat16 refused (a macOS before 14): float16 autocast with float32 weights, which every
    supported macOS runs; any other dtype: float32 before the op, or the CPU fallback."""
    if dtype == "bfloat16":
        return autocast_remedy("float16")
    return (f"cast the {dtype} tensor to float32 before this op, or set {FALLBACK_ENV}=1 "
            f"to run this op on the CPU (slow: a copy each way)")


RULE = Rule(
    code="DD121",
    name="op-unimplemented-on-mps",
    severity="error",
    summary="An op Apple's MPS backend does not implement for an operand's dtype (by macOS version).",
    why=(
        "MPS implements fewer kernels than CPU or CUDA, and some only from a macOS version on. An op without an "
        "MPS kernel for its dtype raises NotImplementedError unless PYTORCH_ENABLE_MPS_FALLBACK=1, which runs it "
        "on the CPU with a copy each way."
    ),
    example=(
        "torch.linalg.eig(torch.randn(3, 3, device='mps'))\n"
        "NotImplementedError: The operator 'aten::linalg_eig' is not currently implemented for the MPS device."
    ),
    fix="Cast to a dtype MPS implements before the op, run the op on the CPU, or set PYTORCH_ENABLE_MPS_FALLBACK=1.",
    fix_safety="Shown, never applied: the refusal is a Mac's, which a CPU re-run cannot check.",
    check=check,
    rejects=lambda op: refusal(op) is not None,
    references=("torch/testing/_internal/common_mps.py UNIMPLEMENTED_XFAILLIST, MACOS_BEFORE_14_4_XFAILLIST",),
    device_note="Judged for a trace whose tensors are on mps, from the installed torch's common_mps.py.",
)
