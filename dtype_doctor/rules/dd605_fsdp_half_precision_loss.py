"""DD605: a class-index loss computed in bf16/fp16 on the output of a fully_shard unit."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.ops.families import CLASS_LOSS, base_op
from dtype_doctor.records import HALF, Finding, ShardGroup, TensorMeta, Trace
from dtype_doctor.rules.base import Rule


def outermost(shards: tuple[ShardGroup, ...]) -> list[ShardGroup]:
    """The units no other unit holds: the ones whose output leaves FSDP's hands."""
    names = [g.module for g in shards]
    return [g for g in shards if not any(o != g.module and (o == "" or g.module.startswith(o + ".")) for o in names)]


def out_dtype(unit: ShardGroup) -> str | None:
    """The dtype a unit returns floating outputs in: output_dtype, else what its gathered weights compute in."""
    return unit.output_dtype or unit.param_dtype


def _returned(trace: Trace, module: str, t: TensorMeta) -> bool:
    """Whether a call of `module` returned a tensor of `t`'s dtype and shape."""
    return any(m.name == module and any(o.dtype == t.dtype and o.shape == t.shape for o in m.outputs) for m in trace.modules)


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.shards:
        return
    for op in trace.ops:
        if op.phase != "forward" or base_op(op.op) not in CLASS_LOSS or not op.operands:
            continue
        logits = op.operands[0]
        # The unit that returned these logits: a bf16 model whose layers alone are sharded makes them in its own
        # head, outside every unit, and no unit's output_dtype would change them.
        units = [g for g in outermost(trace.shards) if g.strategy == "fsdp2" and out_dtype(g) == logits.dtype
                 and _returned(trace, g.module, logits)]
        if logits.dtype not in HALF or not units:
            continue
        unit = units[0]
        where = f"fully_shard({unit.module or 'the model'})"
        why = f"output_dtype={unit.output_dtype}" if unit.output_dtype else f"param_dtype={unit.param_dtype}, output_dtype unset"
        yield RULE.finding(
            f"{where} returns its logits in {logits.dtype} ({why}): the loss's log_softmax and nll_loss run in "
            f"{logits.dtype} and the loss itself is {logits.dtype}; nothing raises",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage="loss",
            tensors=(logits,),
            hints=(f"MixedPrecisionPolicy(param_dtype=torch.{unit.param_dtype}, output_dtype=torch.float32) on {where}",
                   "or logits.float() before the loss"),
        )
        return


RULE = Rule(
    code="DD605",
    name="fsdp-half-precision-loss",
    severity="warning",
    summary="cross_entropy / nll_loss on a fully_shard unit's bf16/fp16 output: MixedPrecisionPolicy's output_dtype unset or half.",
    why=(
        "FSDP2 returns a unit's output in output_dtype, or, when it is unset, in the dtype its weights were gathered in "
        "(param_dtype). A loss taken on those logits runs log_softmax over the classes in bfloat16 (8-bit mantissa) "
        "and returns a bfloat16 loss: the run goes on, and the loss and its gradients carry bf16's rounding."
    ),
    example=(
        "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))\n"
        "loss = F.cross_entropy(model(x), y)  # loss.dtype == torch.bfloat16"
    ),
    fix="Set MixedPrecisionPolicy(output_dtype=torch.float32) on the outermost unit, or cast the logits to float32 before the loss.",
    fix_safety="display-only: the policy is in your launch code.",
    check=check,
    device_note="Judged from the loss ops the traced step ran and the units' policies; the same on every device (the gloo run on the CPU computes the loss in bf16 too).",
)
