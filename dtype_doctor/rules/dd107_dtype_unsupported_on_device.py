"""DD107: a kernel that has no implementation for an operand's dtype on the target device."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import INTEGER, Finding, OpCall, Remedy, Trace
from dtype_doctor.rules._common import (
    autocast_remedy, base_op, describe, family, half_model_remedy, is_half, reraised, source_of, stage_of,
)
from dtype_doctor.rules.base import Rule
from dtype_doctor.ops.families import op_name
from dtype_doctor.trace.verdicts import data_operands, unsupported_dtype


def refused_dtype(op: OpCall) -> str | None:
    """The dtype `op`'s kernel refused outright, if that is why it was refused."""
    return unsupported_dtype(op.error, op.operands) if op.error is not None else None


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple] = set()
    for op in trace.ops:
        dtype = refused_dtype(op)
        if dtype is None or reraised(trace, op):
            continue
        if any(t.dtype == dtype for t in op.operands) and not any(t.dtype == dtype for t in op.operands if t.role != "target"):
            continue  # a loss target's dtype is DD104's (CUDA words int32 targets "not implemented for 'Int'")
        key = (op.module, base_op(op.op), dtype)
        if key in seen:
            continue
        seen.add(key)
        offenders = [t for t in data_operands(op.operands) if t.dtype == dtype] or list(op.operands[:1])
        off = offenders[0] if offenders else None
        name = base_op(op.op).removeprefix("aten.")
        where = f" in {op.module_type}" if op.module_type else ""
        yield RULE.finding(
            f"{name}{where} has no {trace.device} kernel for {dtype}"
            + (f" ({describe(off)})" if off is not None else ""),
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage_of(trace, off) if off is not None else "model-code",
            tensors=tuple(offenders[:3]),
            source=source_of(trace, off) if off is not None else None,
            hints=(_hint(dtype),),
            pytorch_error=op.error,
        )
    yield from _without_bf16_tensor_cores(trace)
    yield from _fp8_without_capability(trace)


FP8_CAPABILITY = (8, 9)  # Blas.cpp _scaled_mm_allowed_device: major >= 9 or (major == 8 and minor == 9)


def fp8_supported(capability: tuple[int, int]) -> bool:
    """Whether CUDA's torch._scaled_mm runs on a GPU of this compute capability."""
    return capability[0] >= 9 or capability == FP8_CAPABILITY


def _fp8_without_capability(trace: Trace) -> Iterator[Finding]:
    """torch._scaled_mm on a GPU before Ada/Hopper: "torch._scaled_mm is only supported on CUDA
    devices with compute capability >= 9.0 or 8.9" (A100, T4 and V100 refuse, L4/4090/H100 run it)."""
    capability = trace.gpu_capability
    if capability is None or fp8_supported(capability):
        return
    ops = [op for op in trace.ops if op.op.startswith("aten._scaled_mm")]
    if not ops:
        return
    op = ops[0]
    half = "bfloat16" if capability >= (8, 0) else "float16"  # bf16 tensor cores start at 8.0
    where = f" in {op.module_type}" if op.module_type else ""
    yield RULE.finding(
        f"torch._scaled_mm{where} needs compute capability 8.9 or 9.0+; {trace.gpu} refuses every fp8 matmul "
        f"({len(ops)} in this step): \"torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 or 8.9\"",
        module=op.module,
        module_type=op.module_type,
        op=op.op,
        stage="model-loading",
        tensors=op.operands[:2],
        # advice, never applied: the fp8 calls are the training recipe's (torchao's conversion); autocast does not remove them
        hints=(f"leave the layers unconverted (no fp8) on this GPU and train under {half} autocast; "
               f"fp8 needs an L4, RTX 4090, H100 or later",),
    )


def _without_bf16_tensor_cores(trace: Trace) -> Iterator[Finding]:
    """bfloat16 matmul, conv and attention on a GPU before compute capability 8.0: PyTorch runs
    them (cuBLAS emulates bf16 GEMMs, conv leaves cuDNN for the native CUDA kernel, SDPA falls
    back to its math kernel) without bf16 tensor cores. Slow, not refused: a warning."""
    capability = trace.gpu_capability
    if capability is None or capability >= (8, 0):
        return
    ops = [
        op for op in trace.ops
        if op.phase == "forward" and op.error is None and family(op.op) in ("matmul", "conv", "attention")
        and any(t.dtype == "bfloat16" for t in data_operands(op.operands))
    ]
    seen: set[str] = set()
    for op in ops:
        kind = family(op.op)
        if kind in seen:
            continue
        seen.add(kind)
        count = sum(family(o.op) == kind for o in ops)
        where = f" in {op.module_type}" if op.module_type else ""
        yield RULE.finding(
            f"{op_name(op.op)}{where} runs in bfloat16 on {trace.gpu}, which has no bfloat16 tensor "
            f"cores: PyTorch runs it emulated, far slower than float16 ({count} bfloat16 {kind} op{'s' if count != 1 else ''})",
            severity="warning",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage="model-loading",
            tensors=tuple(t for t in data_operands(op.operands) if t.dtype == "bfloat16")[:3],
            remedies=(autocast_remedy("float16"), half_model_remedy("float16")),
        )


def _hint(dtype: str) -> Remedy | str:
    """The fix shown (never applied: the refusal is this device's, which a CPU re-run cannot
    check): a half dtype runs under autocast, which picks a dtype the op implements, with the
    weights float32; any other dtype is cast just before the op, in the model's code, which no
    strategy writes (the same tensor may be an index elsewhere)."""
    if is_half(dtype):
        return autocast_remedy(dtype)
    if dtype in INTEGER or dtype == "bool":
        return f"cast the {dtype} tensor to a floating dtype (.float()) before this op"
    return f"cast the {dtype} tensor to float32 before this op"


RULE = Rule(
    code="DD107",
    name="dtype-unsupported-on-device",
    severity="error",
    summary=(
        "A dtype the target device's kernel does not implement (integer gelu, half kernels missing on CPU, "
        "bf16 flash attention before compute capability 8.0; bf16 matmul there: slow, a warning)."
    ),
    why=(
        "PyTorch registers each kernel for a list of dtypes per device. An op given a dtype outside that list "
        "raises (\"not implemented for 'Int'\"); the lists differ between CPU and CUDA, between torch versions "
        "and, for bfloat16, between GPU generations, so a pipeline that runs on one machine can fail on another."
    ),
    example=(
        "x = torch.arange(6).view(2, 3)          # int64\n"
        "torch.nn.functional.gelu(x)\n"
        "NotImplementedError: \"GeluKernelImpl\" not implemented for 'Long'"
    ),
    fix="Give the op a dtype its kernel implements: cast integer activations to float, or keep the weights in float32 and use autocast.",
    fix_safety="cast-inputs and autocast are safe.",
    check=check,
    rejects=lambda op: refused_dtype(op) is not None,
    device_note=(
        "On a real trace the kernel of this machine decides. A simulated CUDA trace uses the per-device dtype "
        "lists of PyTorch's own op database (shipped with dtype-doctor) and the target GPU's compute capability."
    ),
)
