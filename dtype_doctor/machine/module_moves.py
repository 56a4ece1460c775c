"""`model.to("cuda")`, `model.cuda(0)`, `model.to(0)`, `param.data = t` under `run --simulate`: a module
and its parameters move to the simulated GPU as they move to a real one.

torch lets `param.data = t` (`Variable::set_data`) join two tensors of compatible types only
(torch/csrc/autograd/variable.cpp, `VariableHooks::set_data`: `_has_compatible_shallow_copy_type`), and
CPU and CUDA are compatible: both dense (c10/core/TensorImpl.h, `has_compatible_shallow_copy_type`:
"CPU is compatible with CUDA"). `meta`, where a simulated CUDA tensor lives, is not dense, so on this
machine a CPU parameter given a CUDA tensor, or a CUDA one given a CPU tensor, is refused where a GPU
takes it: peft's OLoRA init, bitsandbytes' 8-bit quantize on load, `Module._apply` moving a 4-bit
weight. The simulation answers the pair as a GPU does (`host_and_cuda`), and `set_data_across` gives
the parameter the new tensor keeping it the same object, its class and attributes.
"""

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


def _host(t: torch.Tensor) -> bool:
    """A plain dense CPU tensor (torch's `is_dense`: no sparse, quantized or dispatching subclass)."""
    return t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized \
        and type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__


def host_and_cuda(a: Any, b: Any, sees_cuda: Callable[[torch.Tensor], bool]) -> bool:
    """One of `a`, `b` a CPU tensor and the other a simulated CUDA one (`sees_cuda`; a meta tensor the script
    made itself stays meta, which a GPU refuses too): a pair whose types torch's `set_data` takes on a GPU."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    return any(_host(x) and y.device.type == "meta" and type(y).__torch_dispatch__ is torch.Tensor.__torch_dispatch__
               and sees_cuda(y) for x, y in ((a, b), (b, a)))


def set_data_across(param: torch.Tensor, new: torch.Tensor) -> None:
    """`param.data = new` across the CPU and the simulated GPU, as `set_data` does it on a GPU: `param` stays
    the same Python object (its class, its attributes, its requires_grad) and now holds `new`'s storage,
    dtype, shape and device. The tensor under it is exchanged (torch._C._swap_tensor_impl) for one made from
    `new`, whose autograd record is fresh: a gradient hook registered on `param` before is not carried
    over; its `.grad` is, moved to `new`'s device and dtype where its old one would not fit (Module._apply
    then gives it its own moved gradient)."""
    if param.requires_grad and not (new.is_floating_point() or new.is_complex()):
        raise RuntimeError("data set to a tensor that requires gradients must be floating point or complex dtype")
    grad = param.grad
    carrier = new.detach().requires_grad_(param.requires_grad)
    torch._C._swap_tensor_impl(param, carrier)
    if grad is None:
        return
    if host_and_cuda(grad, new, lambda _t: True):  # the old gradient fits no more: its object moves with param
        set_data_across(grad, torch.zeros_like(grad, device=new.device, dtype=new.dtype))
    try:
        param.grad = grad
    except RuntimeError:  # a gradient of another shape: the parameter starts without one
        pass


def moved_keeping_identity(module: torch.nn.Module, move: Callable[[], Any], swap: bool = True) -> Any:
    """Run `move` (a Module.to / .cuda to the stand-in device) keeping each parameter one object.

    `swap` True (one simulated GPU): torch's own `Module._apply` keeps it, as on a GPU, by setting each
    parameter's `.data`, which the simulation takes across the CPU and the stand-in (`host_and_cuda`).
    `swap` False (several GPUs, whose tensors are fake): the moved parameters are new objects, and
    parameters tied before the move are tied again after it."""
    if swap:
        return move()
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
    move sees the moved parameters): torch's own `_apply` sets `.data` across the CPU and the
    simulated GPU, as on a GPU; with several GPUs, whose tensors are fake, they are re-tied after the move.
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
