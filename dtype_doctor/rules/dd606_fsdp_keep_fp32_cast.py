"""DD606: float32 parameters the user keeps in float32, gathered in a half param_dtype by their fully_shard unit."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import HALF, Finding, ShardGroup, TensorMeta, Trace
from dtype_doctor.rules._common import keep_fp32
from dtype_doctor.rules.base import Rule


def owner(name: str, shards: tuple[ShardGroup, ...]) -> ShardGroup | None:
    """The innermost fully_shard unit holding parameter `name`."""
    units = [g for g in shards if g.module == "" or name.startswith(g.module + ".")]
    return max(units, key=lambda g: len(g.module), default=None)


def check(trace: Trace) -> Iterator[Finding]:
    shards = tuple(g for g in trace.shards if g.strategy == "fsdp2")
    if not shards:
        return
    kept: dict[ShardGroup, list] = {}
    for p in trace.model.parameters:
        unit = owner(p.name, shards)
        if unit is None or unit.param_dtype not in HALF or p.dtype != "float32" or len(unit.trainable_dtypes) > 1:
            continue  # a unit with trainable weights of two dtypes does not run at all: DD601
        # The intention to keep it in float32 is visible: the model declares it, or it is a frozen weight left in
        # float32 beside half ones. (A trainable fp32 weight is mixed precision's master copy: fp32 LoRA adapters
        # on a bf16 base compute in param_dtype as they should.)
        if keep_fp32(trace, p.name) or (not p.requires_grad and HALF & {*unit.trainable_dtypes, *unit.frozen_dtypes}):
            kept.setdefault(unit, []).append(p)
    for unit, found in kept.items():
        module = unit.module
        where = f"fully_shard({module or 'the model'})"
        names = ", ".join(sorted({p.name.rsplit(".", 1)[0] for p in found}))
        yield RULE.finding(
            f"{names} {'is' if ',' not in names else 'are'} kept in float32 but sit{'s' if ',' not in names else ''} in {where}, "
            f"whose param_dtype={unit.param_dtype}: FSDP gathers every parameter of the unit in {unit.param_dtype}, so "
            f"{names} compute{'s' if ',' not in names else ''} in {unit.param_dtype}; nothing raises",
            module=found[0].name.rsplit(".", 1)[0],
            module_type=trace.model.module_type(found[0].name.rsplit(".", 1)[0]),
            stage="model-loading",
            tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in found[:4]),
            hints=(f"fully_shard each of {names} as its own unit first, with MixedPrecisionPolicy(param_dtype=torch.float32, "
                   f"output_dtype=torch.{unit.param_dtype})",),
        )


RULE = Rule(
    code="DD606",
    name="fsdp-keep-fp32-cast",
    severity="warning",
    summary="A module kept in float32 (_keep_in_fp32_modules, or frozen fp32 beside half weights) inside a fully_shard unit whose param_dtype is half.",
    why=(
        "FSDP2 all-gathers every parameter of a unit in the unit's param_dtype (only integer and already-matching "
        "dtypes are left alone): a LayerNorm kept in float32 inside a bf16 unit computes in bf16, silently. Kept "
        "trainable in a bf16 model, the same norm stops the job instead (DD601)."
    ),
    example=(
        "model.to(torch.bfloat16); model.norm.float().requires_grad_(False)\n"
        "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))\n"
        "# model.norm runs native_layer_norm with bfloat16 weights"
    ),
    fix="Shard the fp32 module as its own unit first, with MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.bfloat16).",
    fix_safety="display-only: the sharding is in your launch code.",
    check=check,
    device_note="Judged from the units' policies and parameter dtypes; the same on every device and world size.",
)
