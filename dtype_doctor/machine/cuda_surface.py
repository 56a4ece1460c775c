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

from dtype_doctor.machine.gpus import DEFAULT_PROPERTIES, PROPERTIES, GpuProfile, capability_of

def device_properties(gpu: GpuProfile | None) -> Any:
    """`torch.cuda.get_device_properties()` for the profile: name, major, minor, total_memory, ..."""
    name, total, sms = PROPERTIES.get(gpu.name, DEFAULT_PROPERTIES) if gpu is not None else DEFAULT_PROPERTIES
    if gpu is not None and gpu.name not in PROPERTIES:
        name = f"CUDA GPU sm_{gpu.capability[0]}{gpu.capability[1]}"
    major, minor = capability_of(gpu)
    return types.SimpleNamespace(name=name, major=major, minor=minor, total_memory=total, multi_processor_count=sms,
                                 is_integrated=False, is_multi_gpu_board=False, L2_cache_size=40 * 2**20,
                                 warp_size=32, max_threads_per_multi_processor=2048 if major < 9 else 2048,
                                 gcnArchName="", uuid="GPU-00000000-0000-0000-0000-000000000000")


class SimulatedMemory:
    """What `torch.cuda.memory_allocated` / `max_memory_allocated` read under the simulation: the bytes
    of the live simulated CUDA tensors, per GPU.

    The present is counted from the live tensors themselves (a walk of the garbage collector's
    objects, as exact as the allocator's own count of storages). The peak also counts the storages
    the script's ops made between two questions (activations freed before it asks): each is added
    when the simulation sees it made, and taken off when it is freed.
    """

    def __init__(self, sees_cuda: Callable[[torch.Tensor], bool], index_of: Callable[[torch.Tensor], int],
                 current: "CurrentDevice | None" = None) -> None:
        import weakref

        self.current = current or CurrentDevice(0, 1)
        self.sees_cuda = sees_cuda
        self.index_of = index_of
        self._counted: Any = weakref.WeakSet()
        self._now: dict[int, int] = {}
        self._peak: dict[int, int] = {}

    def saw(self, out: Any) -> None:
        """An op's output: a new storage on a simulated GPU counts until it is freed."""
        import weakref

        for t in (out,) if isinstance(out, torch.Tensor) else (out if isinstance(out, (list, tuple)) else ()):
            if not isinstance(t, torch.Tensor) or t.device.type != "meta" or not self.sees_cuda(t):
                continue
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            if storage in self._counted:
                continue
            self._counted.add(storage)
            k, size = self.index_of(t), storage.nbytes()
            self._now[k] = self._now.get(k, 0) + size
            self._peak[k] = max(self._peak.get(k, 0), self._now[k])
            weakref.finalize(storage, self._freed, k, size)

    def _freed(self, k: int, size: int) -> None:
        self._now[k] = self._now.get(k, 0) - size

    def allocated(self, device: Any = None) -> int:
        """Bytes of the live simulated tensors on GPU `device` (None: the current one)."""
        k = device_index(device, self.current.index)
        seen: set[int] = set()
        total = 0
        for obj in gc.get_objects():
            if issubclass(type(obj), torch.Tensor) and obj.device.type == "meta" and self.sees_cuda(obj) and self.index_of(obj) == k:
                storage = obj.untyped_storage()
                if storage._cdata not in seen:
                    seen.add(storage._cdata)
                    total += storage.nbytes()
        self._peak[k] = max(self._peak.get(k, 0), total)
        return total

    def peak(self, device: Any = None) -> int:
        self.allocated(device)
        return self._peak.get(device_index(device, self.current.index), 0)

    def reset_peak(self, device: Any = None) -> None:
        k = device_index(device, self.current.index)
        self._peak[k] = self._now[k] = self.allocated(device)



class CurrentDevice:
    """The GPU `torch.cuda.set_device(k)` selected: where "cuda" (no index) lands, what current_device() says."""

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count

    def set(self, device: Any) -> None:
        """torch.cuda.set_device: a negative index selects nothing; one past the GPUs is refused, as CUDA does."""
        k = device_index(device, self.index)
        if k < 0:
            return
        if k >= self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{k}; the simulated machine has {self.count} GPU(s))")
        self.index = k

    def selecting(self, device: Any = None) -> "_Selecting":
        """`with torch.cuda.device(k):` — GPU k is current inside, the one before it after."""
        return _Selecting(self, device)


def device_index(device: Any, current: int = 0) -> int:
    """The GPU index a CUDA device argument names ("cuda" and None: the current one)."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, (str, torch.device)):
        d = torch.device(device)
        return d.index if d.index is not None else current
    return current


class Stream:
    """A CUDA stream on a machine where nothing runs: every wait is already satisfied."""

    cuda_stream = 0
    stream_id = 0
    native_handle = 0
    device_type = "cuda"

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = device_index(device)
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority

    def is_capturing(self) -> bool:
        """torch.Stream's: no CUDA graph is being captured (the optimizer's step asks, torch/optim/optimizer.py)."""
        return False

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


def surface_answers(gpu: GpuProfile | None, current: CurrentDevice, memory: SimulatedMemory | None = None) -> Callable[[str, str], Any]:
    """`answers(module, name)` for machine/cuda_api.py's rows: the simulated GPU's answer to `module.name`."""
    cuda = cuda_answers(gpu, current, memory)
    accelerator = accelerator_answers(cuda, current)
    tables = {"torch.accelerator": accelerator, "torch.accelerator.memory": accelerator, "torch.backends.cuda": backends_answers(gpu),
              "torch.backends.cudnn": backends_answers(gpu), "torch.cuda.nvtx": nvtx_answers(),
              "torch.version": {"cuda": CUDA_VERSION}}
    return lambda module, name: tables.get(module, cuda)[name]


def cuda_answers(gpu: GpuProfile | None, current: CurrentDevice, memory: SimulatedMemory | None = None) -> dict[str, Callable[..., Any] | type]:
    """`torch.cuda` attribute → what it is while the script sees the profile's GPU."""
    props = device_properties(gpu)
    capability = (props.major, props.minor)
    memory = memory or SimulatedMemory(lambda t: True, lambda t: current.index, current)
    memory.current = current
    default = Stream()
    count = current.count
    arch = f"sm_{capability[0]}{capability[1]}"
    return {
        **Generators(count).answers(),
        **memory_answers(props, memory),
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "device_count": lambda: count,
        "current_device": lambda: current.index,
        "set_device": current.set,
        "get_device_name": lambda device=None: props.name,
        "get_device_capability": lambda device=None: capability,
        "get_device_properties": lambda device=None: props,
        "is_bf16_supported": lambda including_emulation=True: gpu is None or gpu.bf16_supported(including_emulation),
        "is_tf32_supported": lambda: capability >= (8, 0),
        "get_arch_list": lambda: [arch],
        "get_gencode_flags": lambda: f"-gencode compute=compute_{arch[3:]},code={arch}",
        "can_device_access_peer": lambda device, peer_device: device_index(device) < count and device_index(peer_device) < count,
        "has_half": True,
        "has_magma": True,
        "get_sync_debug_mode": lambda: 0,
        "set_sync_debug_mode": lambda debug_mode: None,
        "ipc_collect": lambda: None,
        "check_error": lambda res: None,
        "synchronize": lambda device=None: None,
        "Stream": Stream,
        "Event": Event,
        "ExternalStream": lambda stream_ptr, device=None: Stream(device),
        "StreamContext": lambda stream: contextlib.nullcontext(stream),
        "get_stream_from_external": lambda data_ptr, device=None: Stream(device),
        "is_current_stream_capturing": lambda: False,
        "current_stream": lambda device=None: default,
        "default_stream": lambda device=None: default,
        "set_stream": lambda stream: None,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "device": current.selecting,
        # device_of(t) selects t's GPU; the doctor reads t's stand-in, so it selects nothing.
        "device_of": _SelectsNothing,
    }


def memory_answers(props: Any, memory: SimulatedMemory) -> dict[str, Callable[..., Any]]:
    """torch.cuda's memory functions: the bytes of the simulated tensors, against the profile's total."""
    allocated, peak, reset_peak = memory.allocated, memory.peak, memory.reset_peak
    fraction = [1.0]

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return max(props.total_memory - allocated(device), 0), props.total_memory

    def summary(device: Any = None, abbreviated: bool = False) -> str:
        return f"simulated {props.name}: {allocated(device)} bytes allocated, peak {peak(device)} (dtype-doctor --simulate)"

    return {
        "memory_allocated": allocated, "memory_reserved": allocated, "memory_cached": allocated, "device_memory_used": allocated,
        "max_memory_allocated": peak, "max_memory_reserved": peak, "max_memory_cached": peak,
        "reset_peak_memory_stats": reset_peak, "reset_max_memory_allocated": reset_peak, "reset_max_memory_cached": reset_peak,
        "reset_accumulated_memory_stats": lambda device=None: None,
        "mem_get_info": mem_get_info,
        "memory_summary": summary,
        "memory_stats": lambda device=None: {"allocated_bytes.all.current": allocated(device), "allocated_bytes.all.peak": peak(device)},
        "memory_stats_as_nested_dict": lambda device=None: {"allocated_bytes": {"all": {"current": allocated(device), "peak": peak(device)}}},
        "empty_cache": lambda: None,
        "get_allocator_backend": lambda: "native",
        "get_per_process_memory_fraction": lambda device=None: fraction[0],
        "set_per_process_memory_fraction": lambda f, device=None: fraction.__setitem__(0, f),
        "caching_allocator_enable": lambda value=True: None,
        "reset_peak_host_memory_stats": lambda: None,
        "reset_accumulated_host_memory_stats": lambda: None,
    }


class _Selecting:
    """torch.cuda.device(k): GPU k is current within the block (None or a negative index: no change)."""

    def __init__(self, current: CurrentDevice, device: Any) -> None:
        self.current = current
        self.idx = device_index(device, current.index) if device is not None else -1
        self.prev_idx = current.index

    def __enter__(self) -> "_Selecting":
        self.prev_idx = self.current.index
        if self.idx >= 0:
            self.current.set(self.idx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.current.index = self.prev_idx


class _SelectsNothing(contextlib.nullcontext):
    """`torch.cuda.device(k)` / `device_of(t)`: there is one simulated machine, nothing to select."""

    def __init__(self, device: Any = None) -> None:
        super().__init__()
        self.idx = device_index(device, 0) if not isinstance(device, torch.Tensor) else 0


def raw_stream(device: int = 0) -> int:
    """`torch._C._cuda_getCurrentRawStream`: the null stream's handle."""
    return 0


class Generators:
    """The CUDA generators' seeds and states, one per GPU. Seeding reaches torch.cuda.default_generators,
    which only a real CUDA initialisation fills (on a machine with a GPU, torch.manual_seed() under
    --simulate raised IndexError, seen on an H100); here each GPU's state is its seed and offset, 16 bytes
    as CUDA's philox state is, kept so that a checkpoint's saved state loads back."""

    DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val, every generator's seed before one is set

    def __init__(self, count: int) -> None:
        self.states = [self._state(self.DEFAULT_SEED) for _ in range(count)]

    @staticmethod
    def _state(seed: int) -> torch.Tensor:
        return torch.tensor(list(seed.to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8)

    def seed_all(self, seed: int) -> None:
        self.states = [self._state(int(seed) & (2**64 - 1)) for _ in self.states]

    def set(self, state: torch.Tensor, device: Any = "cuda") -> None:
        self.states[device_index(device) % len(self.states)] = state.clone()

    def initial_seed(self) -> int:
        return int.from_bytes(bytes(self.states[0][:8].tolist()), "little")

    def answers(self) -> dict[str, Callable[..., Any]]:
        import random

        return {
            "manual_seed": self.seed_all,  # the current GPU's; one seed for all is what a script can tell apart
            "manual_seed_all": self.seed_all,
            "seed": lambda: self.seed_all(random.getrandbits(63)),
            "seed_all": lambda: self.seed_all(random.getrandbits(63)),
            "initial_seed": self.initial_seed,
            "get_rng_state": lambda device="cuda": self.states[device_index(device) % len(self.states)].clone(),
            "set_rng_state": self.set,
            "get_rng_state_all": lambda: [s.clone() for s in self.states],
            "set_rng_state_all": self.set_all,
        }

    def set_all(self, new_states: Any) -> None:
        for k, state in enumerate(new_states):
            self.set(state, k)


def accelerator_answers(cuda: dict[str, Any], current: CurrentDevice) -> dict[str, Any]:
    """`torch.accelerator`'s names, answered by the same simulated GPU as torch.cuda's."""
    return {
        "is_available": lambda check_fork=False: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": cuda["device_count"],
        "current_device_index": cuda["current_device"],
        "current_device_idx": cuda["current_device"],
        "set_device_index": current.set,
        "set_device_idx": current.set,
        "device_index": current.selecting,
        "synchronize": cuda["synchronize"],
        "empty_cache": lambda: None,
        "empty_host_cache": lambda: None,
        "current_stream": cuda["current_stream"],
        "set_stream": lambda stream: None,
        "get_memory_info": cuda["mem_get_info"],
        **{name: cuda[name] for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                                         "memory_stats", "reset_peak_memory_stats", "reset_accumulated_memory_stats")},
    }


def backends_answers(gpu: GpuProfile | None) -> dict[str, Any]:
    """torch.backends.cuda / torch.backends.cudnn: built with CUDA and cuDNN, kernels as the profile's capability allows."""
    major, minor = capability_of(gpu)
    half = (torch.float16, torch.bfloat16)

    def query_dtype(params: Any) -> Any:
        return getattr(getattr(params, "query", None), "dtype", None)

    return {
        "is_built": lambda: True,
        "is_ck_sdpa_available": lambda: False,  # ROCm's
        "is_flash_attention_available": lambda: True,
        # aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: flash needs sm80+ and half inputs, mem-efficient sm50+.
        "can_use_flash_attention": lambda params, debug=False: (major, minor) >= (8, 0) and query_dtype(params) in half,
        "can_use_efficient_attention": lambda params, debug=False: (major, minor) >= (5, 0),
        "is_available": lambda: True,
        "version": lambda: CUDNN_VERSION,
        "is_acceptable": lambda tensor: tensor.device.type in ("cuda", "meta") and tensor.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64),
    }


CUDA_VERSION = "12.8"  # torch.version.cuda of torch's default CUDA 12 wheels
CUDNN_VERSION = 91002  # the cuDNN (9.10.2) that torch's CUDA 12 wheels ship


def nvtx_answers() -> dict[str, Any]:
    """NVTX ranges annotate a profiler's timeline; with no device timeline they mark nothing."""
    return {"range_push": lambda msg: 0, "range_pop": lambda: 0, "range_start": lambda msg: 0,
            "range_end": lambda range_id: None, "mark": lambda msg: None,
            "range": lambda msg, *args, **kwargs: contextlib.nullcontext()}


class _AnyGenerator(type(torch._C.Generator)):  # type: ignore[misc]
    """isinstance(g, torch.Generator) holds for every generator, the script's CPU ones made before too."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, torch._C.Generator)


def generator_class(current: CurrentDevice) -> type:
    """`torch.Generator` under the simulation: `torch.Generator(device=x.device)` for a CUDA tensor (diffusers'
    examples, samplers) is, on the simulated GPU, a CPU generator that reads as cuda:k: seeded and its state
    kept as a CUDA generator's, and accepted by the ops on simulated tensors (which draw no values). A
    CPU-only build refuses a CUDA generator ("Cannot get CUDA generator without ATen_cuda library")."""
    from dtype_doctor.machine.module_moves import is_cuda

    class Generator(torch._C.Generator, metaclass=_AnyGenerator):
        def __new__(cls, device: Any = "cpu") -> Any:
            if device is None or not is_cuda(device):
                return torch._C.Generator(device) if device is not None else torch._C.Generator()
            g = super().__new__(cls, "cpu")
            g.cuda_index = device_index(device, current.index)
            return g

        def __init__(self, device: Any = "cpu") -> None:
            pass

        @property
        def device(self) -> torch.device:  # type: ignore[override]
            return torch.device("cuda", self.cuda_index)

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    return Generator
