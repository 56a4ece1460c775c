"""The outputs of an op on data-less (meta) tensors, worked out once per call signature.

A meta tensor holds no values, so what an op makes of it (each output's dtype, shape, strides)
follows from the call alone: the op, each tensor operand's type, dtype, shape, strides, offset
and device, and every other argument by value. PyTorch works it out in Python for most ops
(torch._refs and torch._prims' meta functions: 50 to 400 µs an op, against a few µs for the
CPU kernel on a small tensor), and a generation loop asks the same question hundreds of times
(the layers of a step, the steps of a loop). `MetaOutputs.run` asks PyTorch once per signature
and, for the same call again, makes the same outputs as fresh meta tensors.

Only where that is provably the same: an op whose schema says its outputs are fresh (no view,
no alias of an operand, no operand written, no random stream), every operand a plain tensor on
meta or a plain value, every output a plain contiguous-or-strided meta tensor at offset 0 with
no conjugate or negative bit. A Parameter is an operand like a plain tensor (its class overrides
neither `__torch_dispatch__` nor what an op makes of it: a norm's `weight * x` is a plain tensor).
Anything else (a view, `add_`, another subclass, a symbolic size, an op that raised) runs as
PyTorch runs it, every time. FakeTensorMode's own dispatch cache is the
same idea for fake tensors (torch/_subclasses/fake_tensor.py, `_cached_dispatch_impl`).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

_META = torch.device("meta")
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_NO_FUNCTION_MODES = torch._C.DisableTorchFunction


def _empty_strided(shape: tuple, stride: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A fresh meta tensor: torch's function (3 µs) rather than the op overload (11 µs), with the function modes
    off (the simulation's would take a tensor asked for on meta as the script's own meta tensor)."""
    with _NO_FUNCTION_MODES():
        return torch.empty_strided(shape, stride, dtype=dtype, device=_META)


def _fresh_outputs(func: Any) -> bool:
    """Whether `func`'s schema says every output is a new tensor made from nothing but its arguments."""
    schema = getattr(func, "_schema", None)
    if schema is None or not isinstance(func, torch._ops.OpOverload) or schema.is_mutable or func.is_view:
        return False
    if torch.Tag.nondeterministic_seeded in func.tags or torch.Tag.dynamic_output_shape in func.tags \
            or torch.Tag.data_dependent_output in func.tags or torch.Tag.inplace_view in func.tags:
        return False
    returns = schema.returns
    return bool(returns) and all(r.alias_info is None and str(r.type) in ("Tensor", "Tensor[]") for r in returns)


def _key(value: Any, depth: int = 0) -> Hashable:
    """One argument as a key; raises _Uncacheable where the call is not one to take from the table."""
    kind = type(value)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if value.device != _META or value.layout is not torch.strided:
            raise _Uncacheable
        return (value.dtype, value.shape, value.stride(), value.storage_offset())
    if kind in _PLAIN:
        return (kind, value)
    if (kind is list or kind is tuple) and depth < 2:
        return (kind, tuple([_key(v, depth + 1) for v in value]))
    raise _Uncacheable  # a subclass, a SymInt, an object: not provably the same call


class _Uncacheable(Exception):
    pass


class MetaOutputs:
    """`run(func, args, kwargs)`: the op's outputs, from the table where the same call ran before."""

    def __init__(self) -> None:
        self._ops: dict[Any, bool] = {}
        self._made: dict[tuple, Any] = {}
        self.hits = 0
        self.misses = 0

    def run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        fresh = self._ops.get(func)
        if fresh is None:
            fresh = self._ops[func] = _fresh_outputs(func)
        if not fresh:
            return func(*args, **kwargs)
        try:
            # The default dtype is the one global a call reads: a factory's float outputs, an int tensor times 1.5.
            key = (func, _key(args), tuple([(k, _key(v, 1)) for k, v in kwargs.items()]) if kwargs else None,
                   torch.get_default_dtype())
            made = self._made.get(key)
        except (_Uncacheable, TypeError):  # TypeError: an unhashable value
            return func(*args, **kwargs)
        if made is not None:
            self.hits += 1
            return made()
        out = func(*args, **kwargs)  # raises as PyTorch raises: nothing is kept for a call that failed
        self.misses += 1
        maker = _maker(out)
        if maker is not None:
            self._made[key] = maker
        return out


def _maker(out: Any) -> Callable[[], Any] | None:
    """A function making outputs like `out` (fresh meta tensors), or None where `out` is not of that kind."""
    many = type(out) in (tuple, list)
    outs = out if many else (out,)
    specs = []
    for t in outs:
        if type(t) is not torch.Tensor or t.device != _META or t.layout is not torch.strided or t.storage_offset() != 0 \
                or t.is_conj() or t.is_neg():
            return None
        specs.append((tuple(t.shape), t.stride(), t.dtype))
    if not many:
        shape, stride, dtype = specs[0]
        return lambda: _empty_strided(shape, stride, dtype)
    kind = type(out)
    return lambda: kind(_empty_strided(s, st, d) for s, st, d in specs)
