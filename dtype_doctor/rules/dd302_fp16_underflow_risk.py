"""DD302: a large share of non-zero values below float16's smallest normal (6.1e-05) — in
gradients (with and without GradScaler's scale) and in module outputs."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FP16_TINY, GRAD_SCALE, Finding, Trace, merge_stats as merge
from dtype_doctor.rules._common import autocast_remedy
from dtype_doctor.rules._numerics import computes_in_fp16
from dtype_doctor.rules.base import Rule

# Gradients: beyond this share a visible part of the update is lost or rounded (subnormal
# fp16 keeps 1-10 bits); GradScaler exists for exactly this case.
GRAD_SHARE = 0.05
# Activations: GELU/SiLU tails and attention weights put a few percent below the normal range
# in healthy models; a module whose outputs are mostly subnormal has lost its precision.
ACTIVATION_SHARE = 0.5
# fp16 autocast, whose words name the GradScaler: shown, not applied (fix runs no backward to check it).
GRAD_SCALER = autocast_remedy("float16")


def check(trace: Trace) -> Iterator[Finding]:
    # Only a step that computes in float16 loses these values; an fp32 or bf16 step keeps them.
    if not trace.values_measured or not (computes_in_fp16(trace) or any(g.dtype == "float16" for g in trace.grads)):
        return
    yield from _gradients(trace)
    for m in trace.modules:
        s = m.stats
        if m.phase != "forward" or s is None or s.below_fp16_normal < ACTIVATION_SHARE or not m.name:
            continue
        if not m.outputs or m.outputs[0].dtype != "float16":
            continue
        yield RULE.finding(
            f"{s.below_fp16_normal:.0%} of {m.module_type}'s non-zero float16 outputs are below its smallest normal "
            f"(smallest {s.min_nonzero:.2g}): they keep only a few bits",
            module=m.name,
            module_type=m.module_type,
            tensors=m.outputs[:1],
        )


def _gradients(trace: Trace) -> Iterator[Finding]:
    if trace.grad_scaler and not trace.grads:
        return
    grads = merge([g.stats for g in trace.grads])
    total = sum(g.stats.numel for g in trace.grads)
    # In an fp16 backward the smallest gradients are already gone: whole tensors of zeros.
    zeroed = sum(g.stats.numel for g in trace.grads if g.stats.absmax == 0) / total if total else 0.0
    if not trace.grad_scaler and zeroed >= GRAD_SHARE:
        yield RULE.finding(
            f"{zeroed:.0%} of gradient values are exactly zero: whole gradients flushed to zero in the float16 "
            "backward without loss scaling",
            stage="optimizer",
            hints=(GRAD_SCALER,),
        )
        return
    if grads is None or grads.below_fp16_normal < GRAD_SHARE:
        return
    scaled = grads.below_fp16_normal_scaled
    if trace.grad_scaler and scaled < GRAD_SHARE:
        return  # what GradScaler is for: scaled, they are representable
    yield RULE.finding(
        f"{grads.below_fp16_normal:.0%} of non-zero gradients are below float16's smallest normal "
        f"({FP16_TINY:.2g}) without loss scaling; {scaled:.0%} with GradScaler's scale {GRAD_SCALE:.0f}"
        + ("" if scaled < GRAD_SHARE else ": even scaled, they underflow"),
        stage="optimizer",
        hints=(GRAD_SCALER,) if scaled < GRAD_SHARE else (),
    )


RULE = Rule(
    code="DD302",
    name="fp16-underflow-risk",
    severity="warning",
    summary="A large share of non-zero values fall below the half dtype's smallest normal: gradients flushing to zero, activations losing precision.",
    why=(
        "float16's smallest normal value is 6.1e-05; below it values keep fewer bits, and below 6e-08 they "
        "become zero. Gradients are often that small: without loss scaling an fp16 backward loses them and "
        "the weights stop learning, silently. torch.amp.GradScaler multiplies the loss (by 65536 at first) "
        "so gradients stay representable, then unscales them in float32."
    ),
    example="38% of non-zero gradients are below float16's smallest normal (6.1e-05) without loss scaling; 0% with GradScaler's scale 65536",
    fix="Use torch.amp.GradScaler with fp16 autocast (or train in bfloat16, whose range is float32's).",
    fix_safety="display-only: a training loop change.",
    check=check,
    device_note=(
        f"Shares are measured on up to 4,096 evenly spaced values per tensor. Judged only for a step that "
        f"computes in float16. Gradients: reported from {GRAD_SHARE:.0%} of non-zero values (or of values "
        f"flushed to zero); activations from {ACTIVATION_SHARE:.0%}. Needs real values."
    ),
)
