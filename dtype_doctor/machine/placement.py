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
from typing import Any, Mapping

from dtype_doctor.machine.gpus import GpuProfile, gpu_profile
from dtype_doctor.records.errors import UsageError

DEVICES_HELP = "auto, cpu, cuda, cuda:N or mps"
CUDA0 = "cuda:0"  # the device a bare "cuda", and a simulated target with no device named, is
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps(:0)?")


@dataclass(frozen=True, slots=True)
class Placement:
    """`device` as users read it ("cpu", "cuda:0"; None: wherever the model already is, the API
    without device=), whether its tensors are simulated (fake tensors, no data), and the GPU
    a simulated CUDA target is given: `gpu` as the user named it (t4, a100, "7.5"; None: the
    default profile) and `profile`, its facts (GpuProfile: capability, memory), worked out here
    once. The stages read the machine's facts off this record (`profile`, `home`, `aliases`,
    `gpus` for the world a launcher spans), never from the raw options."""

    device: str | None
    simulated: bool = False
    gpu: str | None = None
    gpus: int = 1  # simulated GPUs (--gpus): a device map spreads the model over them, a launcher's world spans them
    # auto|balanced|balanced_low_0|sequential, a FILE.json, or (the API) accelerate's dict; None: no device map
    device_map: str | Mapping[str, Any] | None = None
    # --max-memory: (device, size) pairs, "0"/"cpu" → "20GiB"; or (the API) accelerate's dict
    max_memory: tuple[tuple[str, str], ...] | Mapping[Any, Any] = ()
    profile: GpuProfile | None = None  # the facts of `gpu`: filled in from it when not given
    macos: tuple[int, int] | None = None  # a simulated Apple-silicon (mps) target's macOS (machine/mps_placement.py)

    def __post_init__(self) -> None:
        if self.profile is None and self.gpu is not None:
            object.__setattr__(self, "profile", gpu_profile(self.gpu))

    @property
    def home(self) -> Any:
        """The torch.device a simulated CUDA target's tensors live on (machine.home's rule: meta,
        meta:k with several GPUs); None for real tensors."""
        if not self.simulated:
            return None
        from dtype_doctor.machine.home import STAND_IN, simulated_home

        if self.apple:
            return STAND_IN  # a simulated mps tensor lives on meta, as a simulated GPU's does

        return simulated_home(self.device or CUDA0, indexed=self.gpus > 1)

    @property
    def aliases(self) -> dict[str, str]:
        """The simulation's stand-in devices → the devices the report names ("meta" → "cuda:0";
        with a device map meta:k → cuda:k, and "meta" → "cpu" for what it offloads)."""
        if not self.simulated:
            return {}
        if self.mapped:
            return {**gpu_aliases(self.gpus), "meta": "cpu"}
        return {"meta": self.device or CUDA0}

    @property
    def apple(self) -> bool:
        """The target is Apple's MPS device (a real Mac's, or simulated with --device mps)."""
        return (self.device or "").startswith("mps")

    @property
    def mapped(self) -> bool:
        """A device map spreads the model (--device-map, or --gpus above 1)."""
        return self.device_map is not None or self.gpus > 1

    @property
    def multi_gpu(self) -> bool:
        """The step is spread over simulated GPUs by a device map (the stand-ins are meta:k)."""
        return self.simulated and self.device_map is not None


def gpu_aliases(gpus: int) -> dict[str, str]:
    """Indexed stand-in device names → the CUDA devices users read: {"meta:0": "cuda:0", ...}.
    The one table of them: Placement.aliases, the run's stand-ins and the device map read it."""
    return {f"meta:{k}": f"cuda:{k}" for k in range(gpus)}


HERE = Placement(None)  # real tensors, wherever the model already is (the API without device=)
ON_CPU = Placement("cpu")  # real tensors on the CPU


def parse_device(device: str | None) -> str | None:
    """'cuda' → 'cuda:0', 'mps' → 'mps:0'; None and 'auto' stay; anything but auto|cpu|cuda|cuda:N|mps is a UsageError."""
    if device is None:
        return None
    text = str(device)
    if not _DEVICE.fullmatch(text):
        raise UsageError(f"unknown device {text!r}; use {DEVICES_HELP}")
    return CUDA0 if text == "cuda" else "mps:0" if text == "mps" else text


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def parse_max_memory(text: str | None) -> tuple[tuple[str, str], ...]:
    """'0=20GiB,1=20GiB,cpu=64GiB' → (("0", "20GiB"), ...): each device an index or cpu, each size as accelerate reads it."""
    if not text:
        return ()
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        dev, eq, size = part.partition("=")
        dev, size = dev.strip().removeprefix("cuda:"), size.strip()
        if not eq or not (dev.isdigit() or dev == "cpu") or not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)?", size, re.I):
            raise UsageError(f"--max-memory takes DEVICE=SIZE pairs such as 0=20GiB,cpu=64GiB, not {part!r}")
        pairs.append((dev, size))
    return tuple(pairs)


def _check_device_map(device_map: str | Mapping[str, Any] | None, gpus: int, simulate: bool) -> str | Mapping[str, Any] | None:
    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, not {gpus}")
    if device_map is None:
        return "auto" if gpus > 1 and simulate else None
    if not simulate:
        raise UsageError("--device-map and --gpus place the model on simulated GPUs; add --simulate")
    if isinstance(device_map, Mapping):
        return device_map
    if device_map not in DEVICE_MAPS and not device_map.endswith(".json"):
        raise UsageError(f"--device-map must be {', '.join(DEVICE_MAPS)} or a FILE.json, not {device_map!r}")
    return device_map


def decide(device: str | None = "auto", *, simulate: bool = False, gpu: str | None = None, real_only: str | None = None,
           gpus: int = 1, device_map: str | Mapping[str, Any] | None = None,
           max_memory: str | Mapping[Any, Any] | None = None, macos: str | None = None) -> Placement:
    """The Placement for what the user asked.

    `gpus` > 1 with --simulate spreads the model with a device map (`device_map`, default auto),
    as from_pretrained(device_map=...) does on that many GPUs of the --gpu profile.

    auto: a simulated target is cuda:0; a real one is cuda:0 where torch has a GPU, else cpu.
    A CUDA device asked for without one is refused here, once: with a `--simulate` hint, or
    with `real_only` (why this command measures real tensors) where simulation cannot help.
    """
    wanted = parse_device(device)
    if (wanted or "").startswith("mps") or macos is not None:
        from dtype_doctor.machine.mps_placement import decide_mps

        device, simulated, version = decide_mps(wanted, simulate=simulate, gpu=gpu, gpus=gpus, device_map=device_map, macos=macos)
        return Placement(device, simulated, macos=version)
    if gpus > 1 and not simulate:
        raise UsageError(f"--gpus {gpus} simulates {gpus} GPUs; add --simulate")
    mapped = _check_device_map(device_map, gpus, simulate)
    memory = max_memory if isinstance(max_memory, Mapping) else parse_max_memory(max_memory)
    if memory and mapped is None:
        raise UsageError("--max-memory bounds what a device map puts on each device; add --device-map (or --gpus N)")
    profile = gpu_profile(gpu)  # a bad name is a usage error here, before anything loads
    if simulate:
        return Placement(CUDA0 if wanted in (None, "auto") else wanted, True, gpu, gpus, mapped, memory, profile)
    if wanted is None:
        return Placement(None, False, gpu, profile=profile)
    import torch

    if wanted == "auto":
        return Placement(CUDA0 if torch.cuda.is_available() else "cpu", False, gpu, profile=profile)
    if wanted.startswith("cuda"):
        require_cuda(wanted, real_only=real_only)
    return Placement(wanted, False, gpu, profile=profile)


def require_cuda(device: str, *, real_only: str | None = None) -> None:
    """Refuse a CUDA `device` this machine does not have (no GPU, or fewer than its index)."""
    import torch

    if not torch.cuda.is_available():
        hint = real_only or "pass --simulate (simulate=True) to trace for it with fake tensors"
        raise UsageError(f"device {device} is not available here (torch.cuda.is_available() is False); {hint}")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"device {device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
