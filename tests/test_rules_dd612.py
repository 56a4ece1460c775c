"""DD612 launch-precision-unsupported: bf16 before Ampere, fp8 below 8.9, for the --gpu profile."""

from dtype_doctor.records import LaunchConfig
from dtype_doctor.machine.gpus import gpu_profile
from helpers_launch import judged


def launch(mixed: str) -> LaunchConfig:
    return LaunchConfig("accelerate", 8, mixed)


def test_bf16_on_a_t4_and_fp8_on_an_a100_are_named():
    assert not gpu_profile("t4").bf16 and gpu_profile("a100").bf16  # the profiles' native bf16
    assert "DD612" in judged(launch("bf16"), gpu="t4")
    assert "DD612" in judged(launch("fp8"), gpu="a100")


def test_what_the_gpu_runs_is_not():
    assert "DD612" not in judged(launch("bf16"), gpu="a100")
    assert "DD612" not in judged(launch("fp8"), gpu="h100")
    assert "DD612" not in judged(launch("fp16"), gpu="t4")
