"""Repair an op's operands after a dtype/device error so the trace can go on.

The repairs are the fixes a user would make (cast the input to the weight's dtype,
indices and class targets to int64, masks to bool or the query dtype, everything to the
weights' device); the error itself is already recorded. The trace after a repaired op
therefore shows what the model would do once that one problem is fixed.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def repair(
    op_name: str,
    operands: list[tuple[torch.Tensor, str | None]],
    args: tuple,
    kwargs: dict,
    kind: str,
) -> Iterator[tuple[tuple, dict]]:
    tensors = [t for t, _ in operands]
    roles = {id(t): r for t, r in operands}
    if kind == "device":
        for device in _candidate_devices(tensors):
            yield _rebuild(args, kwargs, lambda t: t.to(device) if t.dim() > 0 or t.device != device else t)
        return
    # dtype
    to_long = {
        id(t)
        for t, r in operands
        if t.dtype != torch.int64 and (r == "index" or (r == "target" and not t.is_floating_point()))
    }
    if to_long:
        yield _rebuild(args, kwargs, lambda t: t.long() if id(t) in to_long else t)
    masks = [t for t, r in operands if r == "mask"]
    floats = [t for t in tensors if t.is_floating_point() and roles.get(id(t)) not in ("mask", "index", "target")]
    if masks:
        q = floats[0] if floats else None

        def fix_mask(t: torch.Tensor) -> torch.Tensor:
            if roles.get(id(t)) != "mask":
                return t.to(q.dtype) if (q is not None and t.is_floating_point() and t.dtype != q.dtype) else t
            if t.is_floating_point():
                return t.to(q.dtype) if q is not None else t
            return t.bool()

        yield _rebuild(args, kwargs, fix_mask)
        yield _rebuild(args, kwargs, lambda t: t.bool() if roles.get(id(t)) == "mask" else t)
    targets = [t for t, r in operands if r == "target" and t.is_floating_point()]
    for anchor in _anchor_dtypes(operands):

        def cast(t: torch.Tensor, anchor: torch.dtype = anchor) -> torch.Tensor:
            role = roles.get(id(t))
            if role in ("index", "mask"):
                return t
            if role == "target" and not t.is_floating_point():
                # class-index losses want int64; value losses (BCE, MSE) the prediction's dtype
                return t.long() if "nll_loss" in op_name else t.to(anchor)
            if t.is_floating_point():
                return t.to(anchor) if t.dtype != anchor else t
            # an integer activation where the op needs the weights' floating dtype
            return t.to(anchor) if t.dtype != torch.bool and t.dim() > 0 else t

        yield _rebuild(args, kwargs, cast)
    if targets:
        yield _rebuild(args, kwargs, lambda t: t.long() if roles.get(id(t)) == "target" else t)
    # Last: a kernel with no implementation for the dtype (integer gelu, bool neg, half cdist
    # on CPU) gets float32 data, as the fix (.float()) would give it.
    yield _rebuild(args, kwargs, lambda t: t if roles.get(id(t)) in ("index", "mask") else _as_float32(t))
    yield _rebuild(args, kwargs, _as_float32)


def _as_float32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 or t.is_complex() else t.float()


def _anchor_dtypes(operands: list[tuple[torch.Tensor, str | None]]) -> list[torch.dtype]:
    """Dtypes to unify floating operands to: the weight's first, then the first operand's."""
    out: list[torch.dtype] = []
    for t, role in operands:
        if role in ("weight", "bias") and t.is_floating_point() and t.dtype not in out:
            out.append(t.dtype)
    for t, _ in operands:
        if t.is_floating_point() and t.dtype not in out:
            out.append(t.dtype)
    return out[:3]


def _candidate_devices(tensors: list[torch.Tensor]) -> list[torch.device]:
    devices: list[torch.device] = []
    for t in tensors:
        if t.device.type != "cpu" and t.device not in devices:
            devices.append(t.device)
    for t in tensors:
        if t.device not in devices:
            devices.append(t.device)
    return devices


def _rebuild(args: tuple, kwargs: dict, f: Any) -> tuple[tuple, dict]:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return f(a)
        if isinstance(a, list):
            return [one(x) for x in a]
        if isinstance(a, tuple):
            return tuple(one(x) for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}
