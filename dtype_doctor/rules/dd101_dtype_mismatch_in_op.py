"""DD101: floating operands of different dtypes meet in an op that needs one dtype."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, OpCall, TensorMeta, Trace
from dtype_doctor.ops.operands import anchor_dtype, required_dtype
from dtype_doctor.rules._common import (
    autocast_remedy,
    cast_remedies,
    half_model_remedy,
    input_name,
    ATTENTION, CONV, INDEX_PUT, MATMUL, NORM, base_op, describe, family, is_half, kernel_dtype, main_dtype, refused,
    source_of, stage_of,
)
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import RNN_INPUT_CHECK

PARAM_ROLES = ("weight", "bias", "buffer")


def mismatched(op: OpCall) -> tuple[TensorMeta, ...] | None:
    """The operands that disagree, or None when PyTorch accepts the op as it is."""
    family = base_op(op.op)
    if family in MATMUL or family in CONV:
        # An integer activation (uint8 pixel_values, int64 features) meets a float weight just as
        # badly as a second float dtype does: "mat1 and mat2 must have the same dtype".
        data = [t for t in op.operands if not t.is_scalar and t.role not in ("index", "mask")]
        if not any(t.is_floating for t in data):
            return None
        # Under autocast a float64 or integer operand is not cast and still mismatches.
        return tuple(data) if len({kernel_dtype(op, t) for t in data}) > 1 else None
    if family in NORM and op.operands:
        x = op.operands[0]
        params = [t for t in op.operands[1:] if t.is_floating and t.role in PARAM_ROLES]
        # Half input with fp32 affine params is a mixed-type kernel every CPU norm and CUDA's
        # batch norm run; CUDA's layer_norm/group_norm refuse it (trace/cuda_table.py): the
        # kernel's verdict decides.
        mixed_ok = not refused(op)
        bad = [p for p in params if p.dtype != x.dtype and not (mixed_ok and is_half(x.dtype) and p.dtype == "float32")]
        return (x, *bad) if bad else None
    if family in INDEX_PUT and op.operands:
        dest = op.operands[0]
        values = [t for t in op.operands[1:] if t.role != "index"]
        return (dest, values[-1]) if values and values[-1].dtype != dest.dtype else None
    if family == RNN_INPUT_CHECK:
        # nn.RNNBase's own check: the input against the first weight (torch/nn/modules/rnn.py).
        return tuple(op.operands[:2]) if len({t.dtype for t in op.operands[:2]}) > 1 else None
    if family in ATTENTION:
        qkv = [t for t in op.operands if t.role != "mask"][:3]
        return tuple(qkv) if len({kernel_dtype(op, t) for t in qkv}) > 1 else None
    return None


def check(trace: Trace) -> Iterator[Finding]:
    main = main_dtype(trace)
    seen: set[tuple] = set()
    for op in trace.ops:
        if op.phase != "forward":
            continue
        bad = mismatched(op)
        if not bad or not refused(op):
            continue
        key = (op.module, family(op.op), tuple(sorted({t.dtype for t in bad})))
        if key in seen:
            continue
        seen.add(key)
        yield _finding(trace, op, bad, main)


def _finding(trace: Trace, op: OpCall, bad: tuple[TensorMeta, ...], main: str | None) -> Finding:
    weights = sorted((t for t in bad if t.role in PARAM_ROLES), key=lambda t: t.role != "weight")
    others = [t for t in bad if t.role not in PARAM_ROLES]
    what = op.module_type or base_op(op.op)
    remedies = []
    if weights and (main is None or weights[0].dtype == main or not others):
        expected = weights[0].dtype
        offenders = [t for t in others if t.dtype != expected] or [t for t in weights if t.dtype != expected]
        off = offenders[0] if offenders else bad[0]
        message = f"{what} received {off.dtype} {describe(off)} but its weight is {expected}"
        remedies += cast_remedies(trace, others, lambda t: required_dtype(t.role, t.dtype, anchor=expected))
        if is_half(expected):
            remedies.append(autocast_remedy(expected))
        elif is_half(off.dtype):
            # Half inputs into an fp32 model: the model could be half too (precision is the cost).
            remedies.append(half_model_remedy(off.dtype))
    elif weights:
        # The weight is the odd one out: the model itself holds mixed dtypes.
        off = next((w for w in weights if w.dtype != main), weights[0])
        expected = main or others[0].dtype
        said = describe(others[0])
        # "input_ids float32" reads as "float32 input_ids"; a made tensor as "a float32 tensor from randn"
        got = f"a {others[0].dtype} {said.removeprefix('a ')}" if said.startswith("a tensor") else f"{others[0].dtype} {said}"
        message = f"{what} has a {off.dtype} weight ({off.name}) but receives {got}"
        if is_half(expected):
            remedies += [half_model_remedy(expected, off.name.rsplit(".", 1)[0] if off.name else op.module), autocast_remedy(expected)]
    else:
        ref = next((t for t in bad if t.dtype == main), bad[0])
        off = next((t for t in bad if t.dtype != ref.dtype), bad[-1])
        message = f"{base_op(op.op)} in {what} mixes {ref.dtype} and {off.dtype} operands ({describe(ref)}, {describe(off)})"
        # The consumer's dtype: an operand the model made (an index_put destination, an activation).
        expected = anchor_dtype(((t.dtype, t.role, input_name(t) is not None) for t in bad), inputs_too=False) or main or ref.dtype
        remedies += cast_remedies(trace, bad, lambda t: required_dtype(t.role, t.dtype, anchor=expected))
    stage = stage_of(trace, off, rejected=lambda d: d != expected)
    return RULE.finding(
        message,
        module=op.module,
        module_type=op.module_type,
        op=op.op,
        stage=stage,
        tensors=bad,
        source=source_of(trace, off),
        pytorch_error=op.error,
        remedies=remedies,
    )


RULE = Rule(
    code="DD101",
    name="dtype-mismatch-in-op",
    severity="error",
    summary="Floating operands of different dtypes meet in an op that needs one dtype (matmul, conv, norm, index_put, attention), outside autocast.",
    why=(
        "Matmul, convolution, normalisation with affine parameters, index_put and attention kernels take one "
        "floating dtype. PyTorch raises at the first such op and names only that op; the same pipeline may "
        "hold several. Under torch.autocast the operands are cast per op and the error does not occur."
    ),
    example=(
        "model = AutoModelForImageClassification.from_pretrained(path, dtype=torch.float16)\n"
        "batch = processor(images, return_tensors='pt')   # pixel_values float32\n"
        "model(**batch)\n"
        "RuntimeError: Input type (float) and bias type (c10::Half) should be the same"
    ),
    fix=(
        "Cast the input to the weight's dtype where the pipeline produces it (cast-inputs), or run the forward "
        "under torch.autocast (autocast). A half-precision input into an fp32 norm is accepted by PyTorch and "
        "is not reported."
    ),
    fix_safety="cast-inputs and autocast are safe; half-model changes weight precision (unsafe).",
    check=check,
    rejects=lambda op: mismatched(op) is not None,
    references=("https://pytorch.org/docs/stable/amp.html",),
    device_note=(
        "Judged by the rules PyTorch applies on both CPU and CUDA: matmul/conv operands must match; norm layers "
        "accept half input with fp32 parameters, not the reverse."
    ),
)
