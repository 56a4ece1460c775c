"""A distributed step in one CPU process, with PyTorch's own pieces.

`fake_world(N)` starts torch's fake process group (`torch.testing._internal.distributed.fake_pg`:
`FakeStore`, backend "fake") as rank 0 of N and gives a CPU `DeviceMesh` over it: `fully_shard`,
FSDP1, DDP and DeepSpeed's torch.distributed calls run unchanged; every collective returns at once
without moving data, and goes through the dispatcher, so the recorder sees it as an op
(`c10d._reduce_scatter_base_` with the dtype the gradients are reduced in). `world_of` and
`shard_groups` read what a traced step ran in: the world, and the FSDP units with their
mixed-precision policies and parameter dtypes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from dtype_doctor.numerics import dtype_name
from dtype_doctor.records import ShardGroup, World

@contextlib.contextmanager
def fake_world(size: int, *, rank: int = 0, launcher: str | None = None) -> Iterator[Any]:
    """Rank `rank` of a `size`-rank fake process group, and a 1-D CPU DeviceMesh over it.

    An existing default process group is refused rather than replaced."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from dtype_doctor.records.errors import UsageError

    if size < 1:
        raise UsageError(f"a world has at least one rank, not {size}")
    if dist.is_initialized():
        raise UsageError("a process group is already initialized in this process; fake_world starts its own")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
    _LAUNCHER[0] = launcher
    try:
        yield init_device_mesh("cpu", (size,))
    finally:
        _LAUNCHER[0] = None
        dist.destroy_process_group()


_LAUNCHER: list[str | None] = [None]


def world_of(shards: tuple[ShardGroup, ...] = (), model: torch.nn.Module | None = None) -> World | None:
    """The process group this process is in (None outside one), as the report names it; its
    strategy is FSDP2's when `shards` has units, FSDP1's when `model` holds a FullyShardedDataParallel."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    strategy = shards[0].strategy if shards else ("fsdp" if model is not None and fsdp1_wrapped(model) else None)
    return World(dist.get_world_size(), dist.get_rank(), dist.get_backend(), _LAUNCHER[0], strategy)


_COLLECTIVES = ("c10d.", "_c10d_functional.", "c10d_functional.", "_dtensor.")


def stood_in_values(world: World | None, model: torch.nn.Module, ops: tuple[Any, ...]) -> str | None:
    """Why the values of a step are not its own, when torch's fake process group stood in for the other
    ranks of a distributed model (None when they are): its collectives move no data, so a gathered
    parameter holds this rank's shard and stale memory for theirs, and a reduced gradient this rank's
    alone. Measured: a 2-rank fully_shard'ed MLP's output differs from the same weights' unsharded by ~1.0."""
    if world is None or world.backend != "fake" or world.size < 2:
        return None
    collective = next((op.op for op in ops if op.op.startswith(_COLLECTIVES)), None)
    from torch.nn.parallel import DistributedDataParallel

    if world.strategy is None and collective is None and not any(isinstance(m, DistributedDataParallel) for m in model.modules()):
        return None  # a model that is not distributed: nothing of it went through the process group
    how = f"{world.strategy or 'the distributed model'}" + (f", first collective {collective}" if collective else "")
    return (f"not measured: a fake process group stood in for ranks 1 to {world.size - 1} ({how}); its collectives move "
            "no data, so the gathered parameters and reduced gradients are not the step's values")


def fsdp1_wrapped(model: torch.nn.Module) -> bool:
    """Whether `model` is, or holds, an FSDP1 FullyShardedDataParallel wrapper."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules())


def shard_groups(model: torch.nn.Module) -> tuple[ShardGroup, ...]:
    """The fully_shard units of `model` (FSDP2), each with its policy and the dtypes of the
    parameters it manages (those not managed by a nested unit)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - a torch without FSDP2
        return ()
    units = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    if not units:
        return ()
    owned: dict[int, str] = {}
    for name, m in sorted(units, key=lambda u: -u[0].count(".") - (u[0] != "")):  # innermost first
        for pname, p in m.named_parameters():
            owned.setdefault(id(p), name)
    groups = []
    for name, m in units:
        policy = m._get_fsdp_state()._mp_policy
        params = [(f"{name}.{n}" if name else n, p) for n, p in m.named_parameters() if owned.get(id(p)) == name]
        trainable = [(n, p) for n, p in params if p.requires_grad]
        first_by_dtype: dict[str, str] = {}
        for n, p in trainable:
            first_by_dtype.setdefault(dtype_name(p.dtype), n)
        groups.append(ShardGroup(
            module=name, strategy="fsdp2",
            param_dtype=_name(policy.param_dtype), reduce_dtype=_name(policy.reduce_dtype), output_dtype=_name(policy.output_dtype),
            cast_forward_inputs=bool(policy.cast_forward_inputs),
            trainable_dtypes=tuple(sorted(first_by_dtype)),
            frozen_dtypes=tuple(sorted({dtype_name(p.dtype) for _, p in params if not p.requires_grad})),
            trainable=tuple(first_by_dtype.values()),
        ))
    return tuple(groups)


def _name(dtype: torch.dtype | None) -> str | None:
    return dtype_name(dtype) if dtype is not None else None


def flat_units(model: torch.nn.Module, wrap: tuple[str, ...] | None = None) -> tuple[ShardGroup, ...]:
    """The FlatParameters FSDP1 (use_orig_params=False) would build for `model` with a transformer
    auto-wrap policy over the classes `wrap` (default: the model's `_no_split_modules`, what
    accelerate and Trainer wrap): one unit per instance, the root holding the rest. Each unit's
    parameters are listed in the order FSDP1 flattens them (its _validate_tensors_to_flatten)."""
    classes = set(wrap if wrap is not None else (getattr(model, "_no_split_modules", None) or ()))
    units = [(n, m) for n, m in model.named_modules() if n and type(m).__name__ in classes]
    units = [(n, m) for n, m in units if not any(n.startswith(o + ".") for o, _ in units)] + [("", model)]
    owned: set[int] = set()
    groups = []
    for name, m in units:
        flat: list[tuple[str, str]] = []
        dtypes: set[str] = set()
        for pname, p in m.named_parameters():
            if id(p) in owned:
                continue
            owned.add(id(p))
            full = f"{name}.{pname}" if name else pname
            dtype = dtype_name(p.dtype)
            if dtype not in dtypes:
                dtypes.add(dtype)
                flat.append((full, dtype))
        if flat:
            groups.append(ShardGroup(module=name, strategy="fsdp", param_dtype=None, reduce_dtype=None, output_dtype=None,
                                     cast_forward_inputs=False, trainable_dtypes=(), flat=tuple(flat)))
    return tuple(groups)


@contextlib.contextmanager
def fake_launch(size: int, launcher: str, env: dict[str, str]) -> Iterator[None]:
    """A launched script's rank 0: its environment as the launcher sets it, and whatever backend it
    asks `init_process_group` for (nccl, gloo) given torch's fake one, `size` ranks wide."""
    import os

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    original = dist.init_process_group
    saved = {k: os.environ.get(k) for k in env}

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            original("fake", store=FakeStore(), rank=0, world_size=size)

    os.environ.update(env)
    dist.init_process_group = init_process_group
    _LAUNCHER[0] = launcher
    try:
        yield
    finally:
        dist.init_process_group = original
        _LAUNCHER[0] = None
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
