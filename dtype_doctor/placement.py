"""Where a step runs, decided once at the boundary: the device users read, real or simulated, the GPU.

The CLI's `--device/--simulate/--gpu` and the API's `device=/simulate=/gpu=` become one
`Placement` (`decide`); the stages below take it as decided — the model loader, the transfer
stage, the trace, compare and run. Nothing else asks torch whether CUDA is there in order to
choose a device, and a CUDA device asked for on a machine without one is one error, worded
once. torch is imported only inside the functions that need it (`--help` stays torch-free).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dtype_doctor.errors import UsageError

DEVICES_HELP = "auto, cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True, slots=True)
class Placement:
    """`device` as users read it ("cpu", "cuda:0"; None: wherever the model already is, the API
    without device=), whether its tensors are simulated (fake tensors, no data), and the GPU
    profile a simulated CUDA target is given (t4, a100, "7.5"; None: the default profile)."""

    device: str | None
    simulated: bool = False
    gpu: str | None = None


def parse_device(device: str | None) -> str | None:
    """'cuda' → 'cuda:0'; None and 'auto' stay; anything but auto|cpu|cuda|cuda:N is a UsageError."""
    if device is None:
        return None
    text = str(device)
    if not _DEVICE.fullmatch(text):
        raise UsageError(f"unknown device {text!r}; use {DEVICES_HELP}")
    return "cuda:0" if text == "cuda" else text


def decide(device: str | None = "auto", *, simulate: bool = False, gpu: str | None = None, real_only: str | None = None) -> Placement:
    """The Placement for what the user asked.

    auto: a simulated target is cuda:0; a real one is cuda:0 where torch has a GPU, else cpu.
    A CUDA device asked for without one is refused here, once: with a `--simulate` hint, or
    with `real_only` (why this command measures real tensors) where simulation cannot help.
    """
    wanted = parse_device(device)
    if simulate:
        return Placement("cuda:0" if wanted in (None, "auto") else wanted, True, gpu)
    if wanted is None:
        return Placement(None, False, gpu)
    import torch

    if wanted == "auto":
        return Placement("cuda:0" if torch.cuda.is_available() else "cpu", False, gpu)
    if wanted.startswith("cuda"):
        require_cuda(wanted, real_only=real_only)
    return Placement(wanted, False, gpu)


def require_cuda(device: str, *, real_only: str | None = None) -> None:
    """Refuse a CUDA `device` this machine does not have (no GPU, or fewer than its index)."""
    import torch

    if not torch.cuda.is_available():
        hint = real_only or "pass --simulate (simulate=True) to trace for it with fake tensors"
        raise UsageError(f"device {device} is not available here (torch.cuda.is_available() is False); {hint}")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"device {device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
