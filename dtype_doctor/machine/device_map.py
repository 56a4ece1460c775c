"""A model spread over simulated GPUs the way `from_pretrained(device_map=...)` spreads it.

accelerate decides and dispatches: `get_balanced_memory` / `infer_auto_device_map` place the
modules with the memory of `--gpus` GPUs of the `--gpu` profile (or `--max-memory`), and
`dispatch_model` attaches its real `AlignDevicesHook`s, which move each block's inputs to its
GPU and stream cpu/disk-offloaded weights in. The model's tensors are fake; simulated cuda:k
lives on meta:k, so fake tensors meeting from two GPUs raise what CUDA raises ("Expected all
tensors to be on the same device, but found at least two devices, cuda:2 and cuda:3!"), and the
report reads cuda:k (`aliases`). torch.cuda answers as that machine would while accelerate
plans (machine/simulate.py's CudaSimulation, which also sends `.to(k)`/`device="cuda:k"` to meta:k).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any, Mapping

import torch

from dtype_doctor.records.errors import InputError
from dtype_doctor.machine.home import simulated_home
from dtype_doctor.machine.placement import DEVICE_MAPS, Placement
from dtype_doctor.records import DeviceLoad, DevicePlan

OFFLOADED = ("cpu", "disk")


def require_accelerate(what: str) -> None:
    """accelerate places, dispatches and reads launch configs here; without it, one clear line."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        from dtype_doctor.records.errors import UsageError

        raise UsageError(f"{what} uses accelerate, which is not installed: pip install 'dtype-doctor[cluster]' (or accelerate)")


def simulated_gpus(gpus: int, gpu: Any) -> Any:
    """The CudaSimulation a device map is planned and run under: `gpus` GPUs of profile `gpu`, cuda:k on meta:k."""
    from dtype_doctor.machine.simulate import CudaSimulation

    return CudaSimulation(torch.device("cuda", 0), gpu, gpus=gpus, indexed=True, stops=False)


def _device_key(value: Any) -> int | str:
    """A device-map value as accelerate writes it: a GPU index, "cpu" or "disk"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if text in OFFLOADED:
        return text
    d = torch.device(text)
    if d.type == "cuda":
        return d.index or 0
    raise InputError(f"device map: {text!r} is not a GPU index, cuda:N, cpu or disk")


def _read_map(path: str, gpus: int) -> dict[str, int | str]:
    from dtype_doctor.records.files import read_json_object

    return _checked(read_json_object(Path(path), path, "a device map (module name → device)"), gpus, path)


def _checked(raw: Mapping[str, Any], gpus: int, where: str) -> dict[str, int | str]:
    out = {str(k): _device_key(v) for k, v in raw.items()}
    over = sorted({v for v in out.values() if isinstance(v, int) and v >= gpus})
    if over:
        raise InputError(f"{where} places modules on GPU {over[0]}, and --gpus {gpus} simulates GPUs 0-{gpus - 1}")
    return out


def max_memory_of(gpus: int, gpu: Any, given: tuple[tuple[str, str], ...] | Mapping[Any, Any]) -> dict[int | str, int]:
    """accelerate's max_memory: each GPU the profile's memory, cpu this machine's available memory
    (what accelerate's get_max_memory reads), overridden by --max-memory."""
    from accelerate.utils import convert_file_size_to_int

    from dtype_doctor.machine.gpus import gpu_memory

    memory: dict[int | str, int] = {k: gpu_memory(gpu) for k in range(gpus)}
    memory["cpu"] = _cpu_available()
    pairs = given.items() if isinstance(given, Mapping) else given
    for dev, size in pairs:
        key: int | str = int(dev) if str(dev).isdigit() else str(dev)
        if isinstance(key, int) and key >= gpus:
            raise InputError(f"--max-memory names GPU {key}, and --gpus {gpus} simulates GPUs 0-{gpus - 1}")
        try:
            memory[key] = int(size) if not isinstance(size, str) or size.strip().isdigit() else convert_file_size_to_int(size.strip())
        except ValueError as exc:
            from dtype_doctor.records.errors import UsageError

            raise UsageError(f"--max-memory: {exc}") from None
    return memory


def _cpu_available() -> int:
    from dtype_doctor.machine.host import available

    return available()[0]


def plan(model: torch.nn.Module, strategy: str | Mapping[str, Any], gpus: int, gpu: Any,
         max_memory: tuple[tuple[str, str], ...] | Mapping[Any, Any] = ()) -> tuple[dict[str, int | str], DevicePlan]:
    """The device map accelerate gives `model` (its tensors fake or meta) and the load on each device."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    memory = max_memory_of(gpus, gpu, max_memory)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    with simulated_gpus(gpus, gpu):
        if isinstance(strategy, Mapping):
            device_map, name = _checked(strategy, gpus, "device_map"), "file"
        elif strategy not in DEVICE_MAPS:
            device_map, name = _read_map(strategy, gpus), "file"
        else:
            name = strategy
            bounds = dict(memory)
            if strategy != "sequential":
                bounds = get_balanced_memory(model, max_memory=dict(memory), no_split_module_classes=no_split,
                                             low_zero=strategy == "balanced_low_0")
            device_map = dict(infer_auto_device_map(model, max_memory=bounds, no_split_module_classes=no_split))
    return device_map, _record(model, device_map, name, gpus, memory)


def _record(model: torch.nn.Module, device_map: Mapping[str, int | str], name: str, gpus: int,
            memory: Mapping[int | str, int]) -> DevicePlan:
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    loads: dict[str, list[int]] = {}
    for module, dev in device_map.items():
        label = f"cuda:{dev}" if isinstance(dev, int) else str(dev)
        entry = loads.setdefault(label, [0, 0])
        entry[0] += sizes.get(module, 0)
        entry[1] += 1
    order = [f"cuda:{k}" for k in range(gpus)] + list(OFFLOADED)
    devices = tuple(
        DeviceLoad(d, loads.get(d, [0, 0])[0], memory.get(int(d[5:]) if d.startswith("cuda:") else d), loads.get(d, [0, 0])[1])
        for d in order if d in loads or d.startswith("cuda:")
    )
    readable = tuple((m, f"cuda:{d}" if isinstance(d, int) else str(d)) for m, d in device_map.items())
    return DevicePlan(name, gpus, readable, devices)


def plan_of(model: torch.nn.Module, gpus: int, gpu: Any) -> DevicePlan | None:
    """The plan of a model the user's own script dispatched (from_pretrained(device_map=...) sets
    `hf_device_map`), read against the simulated GPUs' memory; None for a model without one."""
    device_map = getattr(model, "hf_device_map", None)
    if not isinstance(device_map, Mapping) or not device_map:
        return None
    try:
        keys = {m: _device_key(d) for m, d in device_map.items()}
    except (InputError, RuntimeError):
        return None
    return _record(model, keys, "script", gpus, max_memory_of(gpus, gpu, ()))


def dispatched(model: torch.nn.Module, device_map: Mapping[str, int | str], fake_mode: Any) -> torch.nn.Module:
    """A copy of `model` with fake tensors, dispatched by accelerate's `dispatch_model` over meta:k.

    The copy shares no tensor with `model` (its tensors are new fake ones, its modules deep copies),
    so the user's model is never moved or hooked. Run it inside `accelerate_on_fakes()`. Disk-offloaded
    modules are streamed in from the cpu here: a fake tensor cannot be written to disk, and the
    dtype and device a weight arrives with are the same."""
    from accelerate import dispatch_model

    memo: dict[int, Any] = {}
    keys = sorted(device_map, key=len, reverse=True)

    def home(name: str) -> Any:
        # Where the map puts a tensor: its longest module prefix; made there directly, so
        # accelerate's hooks find each weight already on its GPU (a fake .to costs a dispatch).
        key = next((k for k in keys if not k or name == k or name.startswith(k + ".")), "")
        return _stand_in(device_map.get(key, "cpu"))

    with fake_mode:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if id(t) not in memo:  # a tied weight lives where its first name is placed
                fake = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=home(name))
                memo[id(t)] = torch.nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else fake
    clone = copy.deepcopy(model, memo)
    stand_ins = {m: _stand_in(d) for m, d in device_map.items()}
    gpu_indices = sorted(d for d in device_map.values() if isinstance(d, int))
    main = _stand_in(gpu_indices[0] if gpu_indices else 0)
    with fake_mode:
        dispatch_model(clone, stand_ins, main_device=main, force_hooks=True)
    return clone


def _stand_in(d: Any) -> Any:
    """Where a device map entry's simulated tensors live: a GPU index where machine.home says
    (meta:k); "cpu" and "disk" (accelerate's offload) as accelerate names them, on the CPU."""
    return simulated_home(d, indexed=True) if isinstance(d, int) else "cpu"


def spread(model: torch.nn.Module, placement: Placement, fake_mode: Any, stack: contextlib.ExitStack) -> tuple[torch.nn.Module, DevicePlan, dict[str, str]]:
    """The dispatched fake copy of `model` the Placement's device map gives, its plan and the device
    aliases; `stack` holds the simulated GPUs and accelerate's fake-aware hooks open for the trace."""
    require_accelerate("--gpus/--device-map")
    strategy: str | Mapping[str, Any] = placement.device_map or "auto"
    gpu = placement.profile
    device_map, device_plan = plan(model, strategy, placement.gpus, gpu, placement.max_memory)
    stack.enter_context(simulated_gpus(placement.gpus, gpu))  # accelerate's hooks on fakes too (accelerate_on_fakes)
    try:
        clone = dispatched(model, device_map, fake_mode)
    except (ValueError, RuntimeError) as exc:  # accelerate refuses an incomplete map, or one it cannot dispatch
        raise InputError(f"accelerate cannot dispatch this device map: {str(exc).splitlines()[0]}") from None
    return clone, device_plan, placement.aliases
