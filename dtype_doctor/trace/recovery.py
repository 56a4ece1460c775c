"""Repair an op's operands after a dtype/device error so the trace can go on.

The repairs are the fixes a user would make (cast the input to the weight's dtype,
indices and class targets to int64, masks to bool or the query dtype, everything to the
weights' device); the error itself is already recorded. The trace after a repaired op
therefore shows what the model would do once that one problem is fixed.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from dtype_doctor.ops.operands import anchor_candidates, required_dtype
from dtype_doctor.numerics import dtype_name


def repair(
    op_name: str,
    operands: list[tuple[torch.Tensor, str | None]],
    args: tuple,
    kwargs: dict,
    kind: str,
) -> Iterator[tuple[tuple, dict]]:
    tensors = [t for t, _ in operands]
    if kind == "device":
        for device in _candidate_devices(tensors):
            yield _rebuild(args, kwargs, _mover(device))
        return
    if kind == "overflow":
        yield _clamped(tensors, args, kwargs)
        return
    yield from _dtype_repairs(op_name, operands, args, kwargs)
    # A refusal for one reason may hide a second: an out= tensor of another dtype made
    # without device= is refused for its dtype first, then for its device.
    if len({t.device for t in tensors if t.dim() > 0}) > 1:
        for device in _candidate_devices(tensors):
            move = _mover(device)
            moved = {id(t): move(t) for t in tensors}
            new_args, new_kwargs = _rebuild(args, kwargs, lambda t: moved.get(id(t), t))
            yield from _dtype_repairs(op_name, [(moved[id(t)], r) for t, r in operands], new_args, new_kwargs)


def _mover(device: torch.device) -> Any:
    return lambda t: t.to(device) if t.dim() > 0 or t.device != device else t


def _dtype_repairs(
    op_name: str, operands: list[tuple[torch.Tensor, str | None]], args: tuple, kwargs: dict
) -> Iterator[tuple[tuple, dict]]:
    tensors = [t for t, _ in operands]
    roles = {id(t): r for t, r in operands}
    # dtype: each attempt casts operands to operands.required_dtype, the rules' own answer.
    class_target = "nll_loss" in op_name
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
        q = dtype_name(floats[0].dtype) if floats else None

        def fix_mask(t: torch.Tensor) -> torch.Tensor:
            role = roles.get(id(t))
            if role != "mask" and not (q is not None and t.is_floating_point()):
                return t
            return _to(t, required_dtype(role, dtype_name(t.dtype), anchor=q, query=q))

        yield _rebuild(args, kwargs, fix_mask)
        yield _rebuild(args, kwargs, lambda t: t.bool() if roles.get(id(t)) == "mask" else t)
    targets = [t for t, r in operands if r == "target" and t.is_floating_point()]
    for anchor in anchor_candidates((dtype_name(t.dtype), r, False) for t, r in operands)[:3]:

        def cast(t: torch.Tensor, anchor: str = anchor) -> torch.Tensor:
            role = roles.get(id(t))
            if role in ("index", "mask"):
                return t
            if role != "target" and not t.is_floating_point() and (t.dtype == torch.bool or t.dim() == 0):
                return t  # a flag or a scalar, not an integer activation
            return _to(t, required_dtype(role, dtype_name(t.dtype), anchor=anchor, class_target=class_target))

        yield _rebuild(args, kwargs, cast)
    if targets:
        yield _rebuild(args, kwargs, lambda t: t.long() if roles.get(id(t)) == "target" else t)
    # Last: a kernel with no implementation for the dtype (integer gelu, bool neg, half cdist
    # on CPU) gets float32 data, as the fix (.float()) would give it.
    yield _rebuild(args, kwargs, lambda t: t if roles.get(id(t)) in ("index", "mask") else _as_float32(t))
    yield _rebuild(args, kwargs, _as_float32)


def _clamped(tensors: list[torch.Tensor], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Numbers beyond the written dtype's range brought to its largest finite value, as the fix would."""
    dtype = kwargs.get("dtype") or next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
    limit = torch.finfo(dtype).max

    def one(a: Any) -> Any:
        if isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a) > limit:
            return float(max(-limit, min(limit, a)))
        if isinstance(a, torch.Tensor) and a.dim() == 0 and a.is_floating_point():
            return a.clamp(-limit, limit)
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _as_float32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 or t.is_complex() else t.float()


def _to(t: torch.Tensor, dtype: str) -> torch.Tensor:
    return t if dtype_name(t.dtype) == dtype else t.to(getattr(torch, dtype))


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


def rnn_input_refusal(mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """nn.RNNBase's own input-vs-weight dtype check, run before its forward: (PyTorch's message,
    the input, the weight it was compared with), or None when the check passes.

    The check raises a ValueError in Python before any kernel runs, so no op would record it.
    """
    from torch.nn.utils.rnn import PackedSequence

    if not isinstance(mod, torch.nn.RNNBase):
        return None
    x = args[0] if args else kwargs.get("input")
    packed = isinstance(x, PackedSequence)
    data = x.data if packed else x
    update = getattr(mod, "_update_flat_weights", None)
    if update is not None:
        update()  # as forward does first: functional_call may have swapped the parameters in
    weights = getattr(mod, "_flat_weights", None)
    if not isinstance(data, torch.Tensor) or not weights or not isinstance(weights[0], torch.Tensor):
        return None
    try:
        mod.check_input(data, x.batch_sizes if packed else None)
    except ValueError as exc:
        return (str(exc).splitlines()[0][:500], data, weights[0]) if "dtype" in str(exc) else None
    except Exception:  # noqa: BLE001 - a shape problem is the forward's own to raise
        return None
    return None


def rnn_input_repaired(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    """The RNN's arguments with its input cast to `dtype`, as the fix (input.to(weight dtype)) does."""
    from torch.nn.utils.rnn import PackedSequence

    def cast(x: Any) -> Any:
        if isinstance(x, PackedSequence):
            return PackedSequence(x.data.to(dtype), x.batch_sizes, x.sorted_indices, x.unsorted_indices)
        return x.to(dtype) if isinstance(x, torch.Tensor) else x

    if args:
        return (cast(args[0]), *args[1:]), kwargs
    return args, {**kwargs, "input": cast(kwargs.get("input"))}


def rnn_hidden_refusal(args: tuple, kwargs: dict) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """ATen's device check of an RNN's hidden state against its input (aten/src/ATen/native/RNN.cpp,
    check_attributes: "Input and hidden tensors are not at the same device"), run before the forward:
    (its message, the input, the stray hidden state), or None when they agree. The composite kernel
    raises it before any op reaches a dispatch mode, so no op would record it."""
    from torch.nn.utils.rnn import PackedSequence

    x = args[0] if args else kwargs.get("input")
    data = x.data if isinstance(x, PackedSequence) else x
    hx = args[1] if len(args) > 1 else kwargs.get("hx")
    states = [hx] if isinstance(hx, torch.Tensor) else [h for h in hx or () if isinstance(h, torch.Tensor)] if isinstance(hx, tuple) else []
    if not isinstance(data, torch.Tensor):
        return None
    for h in states:
        if h.device != data.device:
            return (f"Input and hidden tensors are not at the same device, found input tensor at {data.device} and hidden "
                    f"tensor at {h.device}", data, h)
    return None


def rnn_hidden_repaired(args: tuple, kwargs: dict, device: torch.device) -> tuple[tuple, dict]:
    """The RNN's arguments with its hidden state on `device`, as the fix (device= where it is made) does."""
    def moved(hx: Any) -> Any:
        if isinstance(hx, tuple):
            return tuple(h.to(device) if isinstance(h, torch.Tensor) else h for h in hx)
        return hx.to(device) if isinstance(hx, torch.Tensor) else hx

    if len(args) > 1:
        return (args[0], moved(args[1]), *args[2:]), kwargs
    return args, {**kwargs, "hx": moved(kwargs.get("hx"))}


def rnn_checked(rec: Any, mod: torch.nn.Module, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """nn.RNNBase refuses an input of another dtype than its weights (in Python), then ATen a hidden
    state on another device than the input, both before any op is seen: record each refusal as an
    op with both operands, then (repairing) hand the forward what the fix would, so the trace goes on."""
    from dtype_doctor.records import OpCall
    from dtype_doctor.trace.verdicts import RNN_INPUT_CHECK

    changed = None
    for op, roles in ((RNN_INPUT_CHECK, ("input", "weight")), (f"aten.{str(getattr(mod, 'mode', 'rnn')).lower()}.input", ("input", "input"))):
        rec._suspended += 1  # the check's and the repair's own tensor calls are not the model's ops
        try:
            refusal = rnn_input_refusal(mod, args, kwargs) if op == RNN_INPUT_CHECK else rnn_hidden_refusal(args, kwargs)
            if refusal is None:
                continue
            message, x, other = refusal
            fix = rnn_input_repaired if op == RNN_INPUT_CHECK else rnn_hidden_repaired
            repaired = fix(args, kwargs, other.dtype if op == RNN_INPUT_CHECK else x.device) if rec.recover else None
        finally:
            rec._suspended -= 1
        operands = (rec.meta(x, roles[0]), rec.meta(other, roles[1]))
        autocast = rec.amp_state if rec.amp is not None else rec.autocast_stack[-1]
        rec.ops.append(OpCall(len(rec.ops), op, name, type(mod).__name__, operands, (), "forward", autocast,
                               rec.aliased(message), repaired is not None, "function"))
        if repaired is None:
            break
        args, kwargs = changed = repaired
    return changed
