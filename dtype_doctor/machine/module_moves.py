"""`model.to("cuda")`, `model.cuda(0)`, `model.to(0)` under `run --simulate`: a module moves to the
simulated GPU as it moves to a real one."""

from __future__ import annotations

from typing import Any, Callable

import torch


def is_cuda(device: Any) -> bool:
    """A device argument that names CUDA: "cuda", "cuda:1", torch.device("cuda"), or an index."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _indices_as_cuda(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`model.to(0)`, `.to(device=0)`: a bare index names a CUDA GPU on a CUDA machine (torch's
    `_parse_to` reads it as the current accelerator's, which a CPU-only build has none of)."""
    def named(d: Any) -> Any:
        return torch.device("cuda", d) if isinstance(d, int) and not isinstance(d, bool) else d

    if args:
        args = (named(args[0]), *args[1:])
    if "device" in kwargs:
        kwargs = {**kwargs, "device": named(kwargs["device"])}
    return args, kwargs


def moved_keeping_identity(module: torch.nn.Module, move: Callable[[], Any], swap: bool = True) -> Any:
    """Run `move` (a Module.to / .cuda to the stand-in device) keeping each parameter one object.

    `swap` False (several GPUs, whose tensors are fake: the fake mode holds weak references to
    them, and torch.utils.swap_tensors refuses those): the moved parameters are new objects, and
    parameters tied before the move are tied again after it."""
    import weakref

    params = list(module.parameters())
    referenced = any(weakref.getweakrefcount(p) or (p.grad is not None and weakref.getweakrefcount(p.grad)) for p in params)
    if swap and not referenced:
        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return move()
        finally:
            torch.__future__.set_swap_module_params_on_conversion(swap)
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for m in module.modules():
        for key, p in m._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((m, key))
    out = move()
    for group in owners.values():
        first, key = group[0]
        for m, k in group[1:]:
            m._parameters[k] = first._parameters[key]
    return out


def patch_module_moves(set_attr: Callable[[Any, str, Any], None], swap: bool) -> None:
    """`model.to("cuda")` / `model.cuda()` keep the model's tensors as a GPU does: each
    parameter stays the same object (tied weights stay tied, an optimizer made before the
    move sees the moved parameters). torch's own swap_tensors does it (a CPU → meta move
    cannot set `.data`); where a parameter is weakly referenced, it is re-tied after the move.
    `set_attr` is the simulation's, which puts torch's own back when it ends."""
    cls = torch.nn.Module
    for name in ("to", "cuda"):
        original = cls.__dict__[name]

        def moving(module: torch.nn.Module, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            if _name == "to":
                args, kwargs = _indices_as_cuda(args, kwargs)  # model.to(0), as model cards write it
                device = torch._C._nn._parse_to(*args, **kwargs)[0]
                if device is None or not is_cuda(device):
                    return _original(module, *args, **kwargs)
            return moved_keeping_identity(module, lambda: _original(module, *args, **kwargs), swap=swap)

        moving.__wrapped__ = original  # type: ignore[attr-defined]
        set_attr(cls, name, moving)
