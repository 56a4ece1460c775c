"""DD304: a torch.compile'd region fuses half-precision elementwise ops, which inductor computes
without the rounding to float16/bfloat16 that eager PyTorch does between them."""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

from dtype_doctor.records import CompiledRegion, Finding, OpCall, Trace, coverage_of
from dtype_doctor.rules.base import Rule

_HALF = ("float16", "bfloat16")


@lru_cache(maxsize=None)
def _pointwise(op: str) -> bool:
    """An elementwise aten op (torch.Tag.pointwise): what inductor fuses into one kernel."""
    import torch

    parts = op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return False
    packet = getattr(torch.ops.aten, parts[1], None)
    overload = getattr(packet, parts[2], None) if packet is not None else None
    return overload is not None and torch.Tag.pointwise in overload.tags


# Elementwise ops that move or select values without computing new ones: nothing to round.
_MOVES = frozenset({"clone", "copy", "copy_", "detach", "alias", "lift_fresh", "fill", "fill_", "zero_", "zeros_like",
                    "ones_like", "full_like", "empty_like", "where", "masked_fill", "masked_fill_", "_to_copy"})


def _in(region: CompiledRegion, op: OpCall) -> bool:
    """An op of the region's forward. The model's own region ("") holds its submodules' ops; ops named
    for the model itself may be the loss or the optimizer's, which the compiled region does not hold."""
    if op.phase != "forward" or not op.module:
        return False
    return region.module == "" or op.module == region.module or op.module.startswith(f"{region.module}.")


def _rounds_to_half(op: OpCall) -> bool:
    """An op eager PyTorch ends by rounding to float16/bfloat16: elementwise arithmetic on half values,
    or a cast down to half (`.to(torch.bfloat16)` of a float32 value)."""
    if op.level != "aten" or not op.outputs or op.outputs[0].dtype not in _HALF:
        return False
    base = op.op.split(".")[1] if op.op.count(".") >= 2 else op.op
    if base == "_to_copy":
        return any(t.dtype == "float32" for t in op.operands)
    return base not in _MOVES and _pointwise(op.op)


def _fusion_groups(trace: Trace, ops: list[OpCall]) -> dict[str, list[OpCall]]:
    """The ops by the module body they run in. An activation or dropout module (a leaf without weights)
    runs in its parent's body: `act_fn(gate(x)) * up(x)` is one group, which inductor fuses into one kernel."""
    names = [n for n, _ in trace.model.module_types]
    weighted = {s.name.rpartition(".")[0] for s in trace.model.state}
    groups: dict[str, list[OpCall]] = {}
    for op in ops:
        key = op.module
        leaf = not any(n.startswith(f"{key}.") for n in names)
        if leaf and key not in weighted and "." in key:
            key = key.rpartition(".")[0]
        groups.setdefault(key, []).append(op)
    return groups


def _half_chains(trace: Trace, region: CompiledRegion) -> list[OpCall]:
    """The ops of the region's module bodies that round to half in two different ops, at least one of them
    arithmetic (`sigmoid(g) * u`, `.to(bf16)` then `* weight`): there inductor fuses a producer and its
    consumer and keeps the value between them in float32. One op a body repeats (the same gelu on every
    call of a block) is not a chain."""
    ops = [op for op in trace.ops if _in(region, op) and _rounds_to_half(op)]
    out: list[OpCall] = []
    for group in _fusion_groups(trace, ops).values():
        kinds = {op.op for op in group}
        if len(kinds) >= 2 and any("_to_copy" not in k for k in kinds):
            out.extend(group)
    return out


def check(trace: Trace) -> Iterator[Finding]:
    for region in coverage_of(trace).compiled:
        if region.backend != "inductor" or region.emulate_precision_casts or not region.called or region.module is None:
            continue
        ops = _half_chains(trace, region)
        if not ops:
            continue  # lone elementwise ops between matmuls round as eager does: nothing fused skips a rounding
        dtype = ops[0].outputs[0].dtype
        names = sorted({op.op.split(".")[1] for op in ops})
        where = f"in {region.module}" if region.module else f"in {region.target}"
        yield RULE.finding(
            f"torch.compile's inductor fuses {len(ops)} {dtype} elementwise ops {where} ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}) and keeps the values between them in float32, skipping the rounding to "
            f"{dtype} that eager PyTorch does after each op: the compiled step's values differ from eager's, and from "
            "this trace, which ran the region eagerly",
            module=region.module or "",
            module_type=region.target,
            op=ops[0].op,
            stage="model-code",
            source=region.source,
            hints=("to compute as eager does, set TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1 in the environment before the "
                   "compile (or torch._inductor.config.emulate_precision_casts = True, or torch.compile(..., "
                   "options={'emulate_precision_casts': True})); leave it off where speed matters more than matching "
                   "eager results",),
        )


RULE = Rule(
    code="DD304",
    name="inductor-skips-half-rounding",
    severity="warning",
    summary="A torch.compile'd region fuses float16/bfloat16 elementwise ops, which inductor computes without eager's rounding between them.",
    why=(
        "Eager PyTorch computes a half-precision op in float32 and rounds its result to float16/bfloat16; the next op "
        "reads that rounded value. When inductor fuses the two into one kernel it elides the downcast-upcast pair, so "
        "the intermediate stays float32. The compiled model's outputs, losses and gradients then differ from eager's "
        "(usually towards the float64 result): parity tests between eager and compiled fail, an eval run in eager does "
        "not reproduce a compiled training run's numbers, and a check made in eager (this trace runs compiled regions "
        "eagerly) is not bit-exact for the compiled step. torch/_inductor/config.py documents the elision under "
        "emulate_precision_casts, the knob that keeps the roundings."
    ),
    example=(
        "model = torch.compile(model.to(torch.bfloat16))\n"
        "y = model(x)  # (x * w + 1.0) * w fused: x * w is never rounded to bfloat16\n"
        "(y - model._orig_mod(x)).abs().max()  # 0.0625 on a CPU, not 0"
    ),
    fix=(
        "Where compiled results must match eager, set TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1 (or "
        "torch._inductor.config.emulate_precision_casts = True, or options={'emulate_precision_casts': True} in "
        "torch.compile) so inductor keeps eager's roundings; otherwise compare eager and compiled with a tolerance "
        "of the half dtype's precision."
    ),
    fix_safety="Advice only: no strategy applies it. Emulating the casts costs some speed; results match eager.",
    check=check,
    references=(
        "torch/_inductor/config.py: emulate_precision_casts (TORCHINDUCTOR_EMULATE_PRECISION_CASTS)",
        "torch/_inductor/codegen/cpp.py: to_dtype's cast cache, skipped under emulate_precision_casts (pytorch#115260)",
    ),
    device_note="Inductor's CPU (C++) and GPU (Triton) code both fuse; on a GPU Triton's enable_fp_fusion also follows the knob.",
)
