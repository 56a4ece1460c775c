"""DD506: an fp8 matmul (torch._scaled_mm) that CUDA refuses: shape, layout or dtype pair.

The CPU kernel accepts every one of these; CUDA's (aten/src/ATen/native/cuda/Blas.cpp, cuBLASLt)
refuses them. The facts, checked on an H100 with scripts/fp8_cuda_facts.py and written as the
README's fp8 table: mat1's trailing dimension and both of mat2's a multiple of 16 (mat1's rows
are free), mat1 row-major and mat2 column-major, not float8_e5m2 × float8_e5m2. Whether the GPU
runs fp8 at all (compute capability 8.9 or 9.0+) is DD107's.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOAT8, Finding, OpCall, Remedy, Trace
from dtype_doctor.rules.base import Rule

SCALED_MM = ("aten._scaled_mm",)
FP8 = FLOAT8  # records.FLOAT8: the float8 dtype names


def is_scaled_mm(op: OpCall) -> bool:
    return op.op.startswith("aten._scaled_mm.") or op.op == "aten._scaled_mm"


def cuda_refusal(op: OpCall) -> str | None:
    """What CUDA's _scaled_mm raises for `op`'s operands (its own words), or None when it runs them."""
    if len(op.operands) < 2:
        return None
    a, b = op.operands[0], op.operands[1]
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    if a.dtype == "float8_e5m2" and b.dtype == "float8_e5m2":
        return "ValueError: Multiplication of two Float8_e5m2 matrices is not supported"
    layouts = op.attr("layouts") or ("row", "column")
    if layouts[0] != "row" or layouts[1] != "column":
        return "RuntimeError: Only multiplication of row-major and column-major matrices is supported by cuBLASLt"
    if a.shape[1] % 16:
        return f"RuntimeError: Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: ({a.shape[0]}x{a.shape[1]})."
    if b.shape[0] % 16 or b.shape[1] % 16:
        return f"RuntimeError: mat2 shape ({b.shape[0]}x{b.shape[1]}) must be divisible by 16"
    return None


def _advice(message: str) -> str:
    if "e5m2" in message:
        text = "keep the forward operands float8_e4m3fn (e5m2 is for gradients, one side of a pair)"
    elif "row-major" in message:
        text = "pass mat2 column-major: a [N, K] weight's .t(), not a contiguous [K, N] tensor"
    else:
        text = "leave this layer out of fp8 conversion (torchao module_filter_fn) or pad its dimensions to multiples of 16"
    return text


def _exclusion(trace: Trace, op: OpCall, message: str) -> tuple[Remedy, ...]:
    """A dimension CUDA refuses: the layer left out of fp8 conversion, computing in its weight's
    dtype (the `fp8-exclude` strategy); nothing for a layout or dtype pair, which the layer's
    own code decides."""
    if "divisible by 16" not in message or not op.module:
        return ()
    weight = next((p.dtype for p in trace.model.parameters if p.name == f"{op.module}.weight"), None)
    out = weight or (op.outputs[0].dtype if op.outputs else "bfloat16")
    return (Remedy("fp8-exclude", op.module, out, "model-code"),)


def check(trace: Trace) -> Iterator[Finding]:
    cuda = trace.device.startswith("cuda")
    seen: set[tuple[str, str]] = set()
    for op in trace.ops:
        if not is_scaled_mm(op):
            continue
        message = cuda_refusal(op)
        if message is None or (op.module, message) in seen:
            continue
        seen.add((op.module, message))
        where = f" in {op.module_type} {op.module}" if op.module_type else ""
        shapes = " × ".join(f"{t.dtype}{list(t.shape)}" for t in op.operands[:2])
        yield RULE.finding(
            f"torch._scaled_mm{where} on {shapes}: CUDA refuses it ({message})"
            + ("" if cuda else "; this CPU trace ran it, a GPU will not"),
            severity="error" if cuda else "warning",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            tensors=op.operands[:2],
            remedies=(excluded := _exclusion(trace, op, message)),
            hints=() if excluded else (_advice(message),),
            # a simulated step's error is the fake kernel's wording: the user reads CUDA's own
            pytorch_error=message if trace.simulated else op.error,
        )


def _explains(trace: Trace) -> bool:
    """A simulated CUDA step stops where the fake kernel refuses (torch's meta checks for CUDA
    tensors): that failure is this rule's finding, not DD001's."""
    failure = trace.failure
    return failure is not None and any(
        is_scaled_mm(op) and op.module == failure.module and cuda_refusal(op) is not None for op in trace.ops
    )


RULE = Rule(
    code="DD506",
    name="fp8-scaled-mm-cuda-constraints",
    severity="error",
    summary="An fp8 matmul (torch._scaled_mm) CUDA refuses: a dimension not a multiple of 16, mat2 not column-major, or float8_e5m2 × float8_e5m2.",
    why=(
        "cuBLASLt's fp8 GEMM takes mat1 row-major and mat2 column-major, K and N multiples of 16, and no "
        "e5m2 × e5m2 pair. The CPU kernel takes all of these, so fp8 code tested on a laptop fails on the first GPU "
        "step — and the backward multiplies transposed operands (the weight's gradient makes the batch's rows an inner "
        "dimension), so a layer whose forward passes can still fail there."
    ),
    example=(
        "a = torch.randn(16, 40, device='cuda').to(torch.float8_e4m3fn)\n"
        "b = torch.randn(48, 40, device='cuda').to(torch.float8_e4m3fn).t()\n"
        "torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)\n"
        "RuntimeError: Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: (16x40)."
    ),
    fix=(
        "Leave the layers whose dimensions are not multiples of 16 out of fp8 conversion (torchao's "
        "convert_to_float8_training(module_filter_fn=...)) or pad them; pass the weight transposed (column-major); "
        "keep forward operands float8_e4m3fn."
    ),
    fix_safety=(
        "fp8-exclude (safe) for a dimension not a multiple of 16: the layer left out of conversion computes in its high "
        "precision (more accurate, not fp8-fast), written as the script's module_filter_fn; the layout and e5m2 advice is display-only."
    ),
    check=check,
    references=("https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/cuda/Blas.cpp",),
    device_note="CUDA refuses, the CPU accepts: a CPU trace reports a warning, a CUDA or simulated CUDA trace an error.",
    explains=_explains,
)
