"""Where a step runs beyond one device: a device map's plan, the process group, the FSDP units,
the launch configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What a device map puts on one device: weight bytes against the bytes it may use."""

    device: str  # cuda:k, cpu or disk
    weights: int  # bytes of the parameters and buffers placed there
    capacity: int | None  # the --gpu profile's memory or --max-memory's (None: disk)
    modules: int  # device-map entries placed there

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "weights": self.weights, "capacity": self.capacity, "modules": self.modules}


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """A device map as accelerate placed it: `strategy` auto|balanced|balanced_low_0|sequential|file,
    `gpus` simulated GPUs, `device_map` module → device, `devices` the load on each."""

    strategy: str
    gpus: int
    device_map: tuple[tuple[str, str], ...]
    devices: tuple[DeviceLoad, ...]

    @property
    def offloaded(self) -> tuple[tuple[str, str], ...]:
        """(module, cpu|disk): what accelerate streams onto a GPU at each forward."""
        return tuple((m, d) for m, d in self.device_map if d in ("cpu", "disk"))


@dataclass(frozen=True, slots=True)
class World:
    """The process group a distributed step is traced in: rank `rank` of `size`, on torch's fake backend."""

    size: int
    rank: int = 0
    backend: str = "fake"
    launcher: str | None = None  # torchrun | accelerate | None (the API)
    strategy: str | None = None  # fsdp2 | fsdp | deepspeed | ddp, when the step is sharded
    config: tuple[tuple[str, Any], ...] = ()  # the launch configuration's precision settings, as read

    def to_dict(self) -> dict[str, Any]:
        out = {"size": self.size, "rank": self.rank, "backend": self.backend, "launcher": self.launcher, "strategy": self.strategy}
        if self.config:
            out["config"] = dict(self.config)
        return out


@dataclass(frozen=True, slots=True)
class ShardGroup:
    """One FSDP unit as the traced step saw it: `fully_shard(module, mp_policy=...)` (fsdp2) or an
    FSDP1 FlatParameter (fsdp); its mixed-precision settings and the dtypes of the parameters it holds."""

    module: str  # "" for the root
    strategy: str  # fsdp2 | fsdp
    param_dtype: str | None
    reduce_dtype: str | None
    output_dtype: str | None
    cast_forward_inputs: bool
    trainable_dtypes: tuple[str, ...]  # the original dtypes of its trainable parameters, sorted
    frozen_dtypes: tuple[str, ...] = ()
    trainable: tuple[str, ...] = ()  # the first few trainable parameters, by name, one per dtype first
    flat: tuple[tuple[str, str], ...] = ()  # fsdp: (parameter, dtype) in the order FSDP1 flattens them, each dtype's first


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How a job is launched, as its launcher reads it: the command line and the accelerate / DeepSpeed
    config files it names. `refused` holds what accelerate or DeepSpeed raise for this configuration
    at launch, as (who, their message)."""

    launcher: str  # accelerate | torchrun | python (a plain script whose TrainingArguments were read)
    processes: int
    mixed_precision: str | None = None  # accelerate's: no | fp16 | bf16 | fp8
    distributed: str | None = None  # deepspeed | fsdp | multi_gpu
    config_file: str | None = None
    deepspeed_config: str | None = None
    ds_fp16: str | None = None  # "true" / "false" / "auto", as the DeepSpeed JSON has it
    ds_bf16: str | None = None
    zero_stage: int | None = None
    offload: tuple[str, ...] = ()  # "optimizer:cpu", "param:nvme"
    refused: tuple[tuple[str, str], ...] = ()
    trainer_args: bool = False  # the precision and DeepSpeed config come from the script's TrainingArguments
