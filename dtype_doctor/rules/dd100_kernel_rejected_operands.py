"""DD100: an op's kernel refused its operands' dtypes or devices, and no other rule explains it.

The catch-all that keeps the promise "no error is dropped": every refusal the recorder
stepped over (or stopped at) is reported, by the rule that explains it when one does and
here otherwise, with PyTorch's own message.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, OpCall, Remedy, TensorMeta, Trace
from dtype_doctor.rules._common import base_op, describe, input_name, reraised, source_of, stage_of
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import classify_error, data_operands


def unexplained(op: OpCall) -> bool:
    """A dtype or device refusal of `op` that no specific rule explains."""
    from dtype_doctor.rules import rejected_by

    kind = classify_error(op.error, op.operands) if op.error is not None else None
    if kind not in ("dtype", "device"):
        return False
    rule = rejected_by(op)
    # An op refused for its dtypes whose operands also sit on two devices: DD201 explains the
    # devices, not the dtypes (a real GPU raises for both, one after the other). The specific
    # dtype rules explain forward ops only: a backward's own refusal (a custom autograd
    # Function's, a kernel pair's) is this rule's to report.
    return rule is None or (kind == "dtype" and rule.code == "DD201") or (op.phase == "backward" and rule.code in _FORWARD_ONLY)


_FORWARD_ONLY = frozenset({"DD101", "DD103", "DD104", "DD106"})


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[tuple] = set()
    # The recorder repairs a refused forward op below autograd, so its backward meets the
    # original operands again and may fail too: a consequence of the repair, which PyTorch
    # would never reach. Backward refusals count only when the forward had none (a refusal:
    # a simulated trace's value read it stepped over, `if mask.any():`, is not one).
    forward_refused = any(
        op.error and op.phase == "forward" and classify_error(op.error, op.operands) in ("dtype", "device", "overflow")
        for op in trace.ops
    )
    stepped = set(trace.resume.refused_ops) if trace.resume is not None else set()  # an optimizer state's: DD404's
    for op in trace.ops:
        if not unexplained(op) or reraised(trace, op) or (op.phase == "backward" and forward_refused) or op.index in stepped:
            continue
        key = (op.module, base_op(op.op), tuple((t.dtype, t.device) for t in op.operands))
        if key in seen:
            continue
        seen.add(key)
        kind = classify_error(op.error or "", op.operands)
        data = [t for t in op.operands if not t.is_scalar]
        shown = ", ".join(f"{describe(t)} {t.dtype if kind == 'dtype' else t.device}" for t in data[:4])
        odd = _odd_one(op, kind)
        name = f"{base_op(op.op).removeprefix('aten.').removeprefix('torch.nn.functional.')}{' in ' + op.module_type if op.module_type else ''}"
        stage = stage_of(trace, odd, what="dtype" if kind == "dtype" else "device") if odd is not None else "model-code"
        message, hints = _explained(op, name, kind, shown, odd, stage)
        yield RULE.finding(
            message,
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage,
            tensors=tuple(data[:4]),
            source=source_of(trace, odd) if odd is not None else None,
            hints=hints,
            pytorch_error=op.error,
        )
    failure = trace.failure
    # The trace stopped at a refusal no op recorded, raised outside any op (a fake kernel's own
    # wording of a refusal the probe recorded counts as recorded: the same op). A batch's collation that
    # refused float token ids before any kernel ran is DD103's to explain.
    if failure is not None and failure.kind in ("dtype", "device") and failure.phase != "collate" and not any(
        op.error and (op.error == failure.message or (failure.op is not None and op.op == failure.op)) for op in trace.ops
    ):
        yield RULE.finding(
            f"{failure.module_type or 'the model'} refused its inputs' {failure.kind}s before running a kernel: {failure.message}",
            module=failure.module,
            module_type=failure.module_type,
            op=failure.op,
            pytorch_error=failure.message,
        )


def _explained(
    op: OpCall, name: str, kind: str, shown: str, odd: TensorMeta | None, stage: str
) -> tuple[str, tuple[Remedy | str, ...]]:
    """The finding's message and hints for a refusal of `kind` (shown, never applied: the
    catch-all knows no fix `fix` could verify)."""
    error = op.error or ""
    if "unsafe to autocast" in error:
        return (
            f"{name} is refused under CUDA autocast: binary_cross_entropy is unsafe in half precision (CPU autocast "
            f"runs it in float32, CUDA raises)",
            ("compute the loss from the logits with binary_cross_entropy_with_logits (BCEWithLogitsLoss), which autocast "
             "runs in float32, or call binary_cross_entropy on .float() inputs inside torch.autocast(enabled=False)",),
        )
    if "without overflow" in error:
        target = next((t for t in op.operands if not t.is_scalar and t.role not in ("mask", "index")), odd)
        written = target.dtype if target is not None else "its dtype"
        return (
            f"{name} writes a number beyond the range of {written} ({shown}): PyTorch refuses it",
            (f"use a value within {written}'s range (torch.iinfo) or a wider dtype",),
        )
    message = f"{name} refused its operands' {'dtypes' if kind == 'dtype' else 'devices'} ({shown})"
    others = [t for t in _compared(op, kind) if t is not odd]
    if odd is None or not others:
        return message, ()
    target = input_name(odd) or ""
    if kind == "dtype":
        return message, (Remedy("cast-inputs", target, others[0].dtype, stage),)
    return message, (Remedy("to-device", target, others[0].device, stage),)


def _odd_one(op: OpCall, kind: str):  # noqa: ANN202 - a TensorMeta or None
    """The operand whose dtype (device) differs from the others', the likely culprit: the one
    in the minority, else the last (the source an op writes into its first operand).

    For dtypes only the operands the kernel computes in count: an int64 index among float
    operands is not odd."""
    what = "dtype" if kind == "dtype" else "device"
    data = _compared(op, kind)
    values = [getattr(t, what) for t in data]
    unique = [t for t in data if values.count(getattr(t, what)) == 1]
    if 1 < len(data) and unique and len(unique) < len(data):
        return unique[0]
    return data[-1] if data else None


def _compared(op: OpCall, kind: str) -> list[TensorMeta]:
    """The operands whose dtypes (devices) must agree."""
    present = [t for t in op.operands if not t.is_scalar]
    if kind != "dtype":
        return present
    return list(data_operands(op.operands)) or present


RULE = Rule(
    code="DD100",
    name="kernel-rejected-operands",
    severity="error",
    summary="An op's kernel refused the dtypes or devices of its operands (scatter/index_add sources, lerp weights, grid_sample grids, out= tensors, RNN states …) where no more specific rule applies.",
    why=(
        "Most PyTorch kernels require their tensor operands to share one dtype and one device. PyTorch stops at "
        "the first refusal; dtype-doctor records each one, steps over it and reports it with PyTorch's message, "
        "so no error is dropped even where no specific rule explains the op."
    ),
    example=(
        "out = torch.zeros(4, dtype=torch.float16)\n"
        "out.scatter_add_(0, index, src)          # src float32\n"
        "RuntimeError: scatter(): Expected self.dtype to be equal to src.dtype"
    ),
    fix=(
        "Cast the odd operand to the dtype (or move it to the device) of the others where it is produced. Under CUDA "
        "autocast, compute a binary cross entropy from logits (BCEWithLogitsLoss)."
    ),
    fix_safety="no automatic fix beyond the general strategies (cast-inputs, to-device).",
    check=check,
    device_note="On a real trace the kernel of this machine decides; a simulated trace asks the real CPU kernel (see DD107 for CUDA differences).",
)
