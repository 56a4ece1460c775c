"""DD610: accelerate refuses the launch's mixed precision against its DeepSpeed config."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    launch = trace.launch
    if launch is None:
        return
    for who, message in launch.refused:
        if who != "accelerate":
            continue
        other = "bf16" if launch.mixed_precision == "fp16" else "fp16"
        asker = f"TrainingArguments({launch.mixed_precision}=True)" if launch.trainer_args else launch.config_file or "the launch"
        yield RULE.finding(
            f"{asker} asks for mixed_precision={launch.mixed_precision} while "
            f"{launch.deepspeed_config} enables {other}: accelerate refuses the job before the first step",
            stage="launch",
            pytorch_error=f"ValueError: {message}",
            hints=(f'set "{other}": {{"enabled": "auto"}} in {launch.deepspeed_config} (accelerate fills it in), '
                   f"or the same precision in both",),
        )


RULE = Rule(
    code="DD610",
    name="launch-mixed-precision-conflict",
    severity="error",
    summary="accelerate launch's mixed_precision contradicts the fp16/bf16 block of the DeepSpeed config it names.",
    why=(
        "accelerate writes its mixed precision into the DeepSpeed config and refuses a config that enables the other "
        "half-precision type (accelerate.utils.DeepSpeedPlugin.set_mixed_precision): the job stops on every rank at "
        "Accelerator(), after the launch."
    ),
    example=(
        "# cfg.yaml: distributed_type: DEEPSPEED, mixed_precision: bf16; ds.json: \"fp16\": {\"enabled\": true}\n"
        "accelerate launch --config_file cfg.yaml train.py\n"
        "ValueError: `--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config file."
    ),
    fix='Write "auto" for the fp16/bf16 "enabled" values in the DeepSpeed JSON, or one precision in both files.',
    fix_safety="display-only: the launch configuration is yours to change.",
    check=check,
    device_note="Judged from the configuration files, by accelerate's own check; the same on every GPU.",
)
