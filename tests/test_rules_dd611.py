"""DD611 deepspeed-fp16-and-bf16: DeepSpeed's config assertion (DeepSpeed is not installed here;
its condition, from deepspeed/runtime/config.py, is both "enabled" values true)."""

from dtype_doctor.records import LaunchConfig
from helpers_launch import judged

LAUNCH = LaunchConfig("accelerate", 8, None, "deepspeed", "cfg.yaml", "ds.json")


def test_both_enabled_is_refused_one_is_not():
    assert "DD611" in judged(LAUNCH, {"fp16": {"enabled": True}, "bfloat16": {"enabled": True}})
    assert "DD611" not in judged(LAUNCH, {"fp16": {"enabled": True}, "bf16": {"enabled": False}})
    assert "DD611" not in judged(LAUNCH, {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})
