"""What `torch.cuda` answers while a script runs under `--simulate`: the `--gpu` profile's GPU.

Libraries ask CUDA for more than a device: its properties (name, capability, total memory,
SM count), free memory, allocated bytes, the current stream (bitsandbytes hands its raw
handle to its kernels), events for timing, `synchronize`. Each is answered as the profile's
GPU would, from the simulated tensors where the answer is about memory; streams and events
order nothing, as nothing runs on a device.
"""

from __future__ import annotations

import contextlib
import gc
import types
from typing import Any, Callable

import torch

from dtype_doctor.machine.gpus import DEFAULT_PROPERTIES, PROPERTIES, GpuProfile

def device_properties(gpu: GpuProfile | None) -> Any:
    """`torch.cuda.get_device_properties()` for the profile: name, major, minor, total_memory, ..."""
    name, total, sms = PROPERTIES.get(gpu.name, DEFAULT_PROPERTIES) if gpu is not None else DEFAULT_PROPERTIES
    if gpu is not None and gpu.name not in PROPERTIES:
        name = f"CUDA GPU sm_{gpu.capability[0]}{gpu.capability[1]}"
    major, minor = gpu.capability if gpu is not None else (8, 0)
    return types.SimpleNamespace(name=name, major=major, minor=minor, total_memory=total, multi_processor_count=sms,
                                 is_integrated=False, is_multi_gpu_board=False, L2_cache_size=40 * 2**20,
                                 warp_size=32, max_threads_per_multi_processor=2048 if major < 9 else 2048,
                                 gcnArchName="", uuid="GPU-00000000-0000-0000-0000-000000000000")


def simulated_bytes() -> int:
    """Bytes held by live simulated tensors (their storages, each counted once)."""
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type == "meta":
            storage = obj.untyped_storage()
            key = storage._cdata
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


class Stream:
    """A CUDA stream on a machine where nothing runs: every wait is already satisfied."""

    cuda_stream = 0

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> "Event":
        return event if event is not None else Event()

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


class Event:
    """A CUDA event: recorded, complete at once, no time between two."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


def cuda_answers(gpu: GpuProfile | None, index: int, gpus: int = 1) -> dict[str, Callable[..., Any] | type]:
    """`torch.cuda` attribute → what it is while the script sees the profile's GPU."""
    props = device_properties(gpu)
    capability = (props.major, props.minor)
    peak = [0]

    def allocated(device: Any = None) -> int:
        now = simulated_bytes()
        peak[0] = max(peak[0], now)
        return now

    def max_allocated(device: Any = None) -> int:
        allocated()
        return peak[0]

    def reset_peak(device: Any = None) -> None:
        peak[0] = 0

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return max(props.total_memory - allocated(), 0), props.total_memory

    default = Stream()
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        # Seeding reaches torch.cuda.default_generators, which only a real CUDA initialisation fills:
        # on a machine with a GPU, torch.manual_seed() under --simulate raised IndexError (seen on an H100).
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "seed": lambda: None,
        "seed_all": lambda: None,
        "init": lambda: None,
        "device_count": lambda: max(index + 1, gpus),
        "current_device": lambda: index,
        "set_device": lambda device: None,
        "get_device_name": lambda device=None: props.name,
        "get_device_capability": lambda device=None: capability,
        "get_device_properties": lambda device=None: props,
        "is_bf16_supported": lambda including_emulation=True: gpu is None or gpu.bf16_supported(including_emulation),
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "memory_allocated": allocated,
        "max_memory_allocated": max_allocated,
        "memory_reserved": allocated,
        "max_memory_reserved": max_allocated,
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "mem_get_info": mem_get_info,
        "Stream": Stream,
        "Event": Event,
        "current_stream": lambda device=None: default,
        "default_stream": lambda device=None: default,
        "set_stream": lambda stream: None,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
    }


def raw_stream(device: int = 0) -> int:
    """`torch._C._cuda_getCurrentRawStream`: the null stream's handle."""
    return 0
