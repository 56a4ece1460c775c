"""accelerate's hooks on the simulated machine: moving fake parameters as accelerate moves real ones."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def accelerate_on_fakes(faked: Any = None) -> Iterator[None]:
    """accelerate's hooks, able to move fake parameters.

    accelerate rebuilds a moved parameter with the class of the one it replaces
    (`type(param)(value, requires_grad=...)`); a fake parameter's class is FakeTensor, which
    cannot be built that way. Here such a parameter is rebuilt as torch.nn.Parameter does it;
    every other tensor goes through accelerate's own function. `faked` (a script's simulation)
    turns a plain meta tensor, which has forgotten its GPU, into a fake one first.
    Its "parameters on the meta device" warning and FakeTensor's data_ptr warning are the simulation's."""
    import logging
    import warnings

    import accelerate.hooks as hooks
    from torch._subclasses.fake_tensor import FakeTensor

    original = hooks.set_module_tensor_to_device

    def set_module_tensor_to_device(module: torch.nn.Module, tensor_name: str, device: Any, value: Any = None,
                                    dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        owner, _, leaf = tensor_name.rpartition(".")
        target = module.get_submodule(owner) if owner else module
        is_param = leaf in target._parameters
        old = target._parameters[leaf] if is_param else target._buffers.get(leaf)
        plain_meta = faked is not None and isinstance(old, torch.Tensor) and not isinstance(old, FakeTensor) and old.device.type == "meta"
        if not isinstance(old, FakeTensor) and not plain_meta:
            return original(module, tensor_name, device, value, dtype, *args, **kwargs)
        source = value if value is not None else (faked(old) if plain_meta else old)
        if dtype is not None and source.is_floating_point():
            source = source.to(dtype)
        moved = source.to(device)
        if moved is old:
            return None  # already there
        if is_param:
            target._parameters[leaf] = torch.nn.Parameter(moved, requires_grad=old.requires_grad)
        else:
            target._buffers[leaf] = moved
        return None

    log = logging.getLogger("accelerate.big_modeling")
    level = log.level
    hooks.set_module_tensor_to_device = set_module_tensor_to_device
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
            yield
    finally:
        hooks.set_module_tensor_to_device = original
        log.setLevel(level)
