"""DD403: training under float16 autocast with no loss scaling."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Remedy, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    # scan/diagnose model a GradScaler for fp16 training (grad_scaler); a run knows whether the script's
    # step called an enabled one (scaler).
    if not trace.train or trace.autocast != "float16" or trace.grad_scaler or trace.scaler is not None:
        return
    if not any(op.phase == "backward" for op in trace.ops):
        return
    # A run knows the line that made the script's scaler disabled: the line to change, and the fix (grad-scaler).
    off = trace.scaler_off
    yield RULE.finding(
        "the step trains under float16 autocast with no loss scaling (no enabled GradScaler scaled the loss): "
        "gradients below 6e-8 flush to 0 in float16's backward, and those below 6e-5 lose their precision",
        stage="optimizer",
        source=off,
        remedies=(Remedy("grad-scaler", "GradScaler", "enabled", "optimizer", off),),
        hints=(
            "scale the loss: scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); scaler.step(optimizer); "
            "scaler.update() (GradScaler(enabled=True); Trainer and accelerate do it with fp16=True)",
            "or run autocast in bfloat16, which needs no scaling, where the "
            + ("Mac has it (macOS 14 or newer)" if trace.on_mac else "GPU has it (Ampere and later)"),
        ),
    )


RULE = Rule(
    code="DD403",
    name="fp16-autocast-without-loss-scaling",
    severity="error",
    summary="A training step runs under float16 autocast with no GradScaler (absent or disabled).",
    why=(
        "float16 holds nothing below 6e-8. Under autocast the backward runs in float16 where the forward did, "
        "and a loss's gradients are small: without a loss scale many of them become exactly 0, the weights they "
        "belong to stop learning, and nothing raises. GradScaler multiplies the loss (65536 to start) and "
        "divides the gradients back in float32 before the optimizer step."
    ),
    example=(
        "scaler = torch.amp.GradScaler(enabled=False)\n"
        "with torch.autocast('cuda', dtype=torch.float16): loss = model(x).loss\n"
        "scaler.scale(loss).backward()  # not scaled: small gradients flush to 0"
    ),
    fix="Enable torch.amp.GradScaler around the backward and the optimizer step, or use bfloat16 autocast.",
    fix_safety=("Safe, under fix --run (grad-scaler): a GradScaler the script made disabled is enabled on that line; "
                "with none, one is made after the optimizer and wraps the script's one backward and optimizer step "
                "(skipped where the loop has several). Verified by running the script again."),
    check=check,
)
