"""DD611: a DeepSpeed config enabling fp16 and bf16 at once."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    launch = trace.launch
    if launch is None:
        return
    for who, message in launch.refused:
        if who == "transformers":
            yield RULE.finding(
                "TrainingArguments(fp16=True, bf16=True): transformers refuses the arguments when the script makes them, "
                "before any model is called",
                stage="launch",
                pytorch_error=f"ValueError: {message}",
                hints=("keep one of fp16=True / bf16=True (bf16 on Ampere and newer; fp16 with its loss scaler before)",),
            )
        elif who == "deepspeed":
            yield RULE.finding(
                f"{launch.deepspeed_config} enables both fp16 and bf16: DeepSpeed's config check fails on every rank",
                stage="launch",
                pytorch_error=f"AssertionError: {message}",
                hints=('keep one of "fp16"/"bf16" enabled (or "auto" with Trainer/accelerate)',),
            )


RULE = Rule(
    code="DD611",
    name="deepspeed-fp16-and-bf16",
    severity="error",
    summary="A DeepSpeed config with both fp16.enabled and bf16.enabled true (or TrainingArguments with fp16 and bf16 both True).",
    why=(
        "DeepSpeed supports one half-precision mode per engine; its config parser asserts it "
        "(deepspeed/runtime/config.py: 'bfloat16 and fp16 modes cannot be simultaneously enabled') when "
        "deepspeed.initialize reads the file, after the launch. transformers' TrainingArguments refuses fp16=True with "
        "bf16=True for the same reason ('At most one of fp16 and bf16 can be True, but not both')."
    ),
    example='{"fp16": {"enabled": true}, "bf16": {"enabled": true}}\nAssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled',
    fix="Enable one of fp16 and bf16 (bf16 on Ampere and newer; fp16 with its loss scaler before).",
    fix_safety="display-only: the DeepSpeed JSON is yours to change.",
    check=check,
    device_note="Judged from the DeepSpeed JSON as DeepSpeed's config class reads it (DeepSpeed is not a dependency of dtype-doctor).",
)
