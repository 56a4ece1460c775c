"""Stand-in values: what a simulated CUDA tensor (no data) is taken to hold where the script reads it.

A training loop reads values all the time: `loss.item()` to log, `if not torch.isfinite(loss)`,
GradScaler's inf check before the optimizer steps, `logits.argmax(-1).tolist()`. A simulated
tensor holds none, so each read gets a stated stand-in and the script goes on along the branch
a healthy run takes:

- a tensor the script (or GradScaler) filled with a constant reads as that constant
  (GradScaler's scale 65536.0); GradScaler's found-inf, written by
  `_amp_foreach_non_finite_check_and_unscale_`, reads 0.0 (no inf or NaN found: the optimizer steps);
- `isfinite(x)` is all True, `isnan` / `isinf` all False, carried through `all`, `any`, `~`, `&`, `|`
  (one known side decides `a & b` when False, `a | b` when True), `max` / `min` and a comparison with a
  number, so a generation loop ends at its length limit, as it does where no EOS is met;
  another condition is False under `any` and a bare `if`, True under `all`;
- any other float reads 1.0 (finite), an int scalar 1 (a count: never a zero divisor), the
  elements of a `.tolist()` / `.cpu()` / `.numpy()` copy 0 (a valid index) or 1.0, a boolean mask's True
  (every element selected, as boolean indexing on the simulated GPU selects);
- data-dependent sizes (`nonzero`, `masked_select`, boolean indexing, `unique`) take every
  element (the largest size the op can give), keeping autograd through the selection.

Every read is kept as a `StandIn` record (what, value, why, the user's line) for the report.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dtype_doctor.machine.home import STAND_IN
from dtype_doctor.records import SourceLoc, StandIn

_TRUE_IF_FINITE = {torch.isfinite: True, torch.Tensor.isfinite: True, torch.isnan: False, torch.Tensor.isnan: False,
                   torch.isinf: False, torch.Tensor.isinf: False, torch.isposinf: False, torch.isneginf: False}
_KEEP = {torch.all, torch.Tensor.all, torch.any, torch.Tensor.any, torch.Tensor.bool, torch.Tensor.clone,
         torch.Tensor.detach, torch.Tensor.reshape, torch.Tensor.view, torch.Tensor.flatten, torch.Tensor.squeeze}
# A reduction of a tensor whose elements are one known value is that value (generate's `unfinished.max() == 0`).
_REDUCE = {torch.max, torch.Tensor.max, torch.min, torch.Tensor.min, torch.amax, torch.Tensor.amax, torch.amin, torch.Tensor.amin}
_COMPARE: dict[Any, Callable[[Any, Any], bool]] = {
    **{f: (lambda a, b: a == b) for f in (torch.eq, torch.Tensor.eq, torch.Tensor.__eq__)},
    **{f: (lambda a, b: a != b) for f in (torch.ne, torch.Tensor.ne, torch.Tensor.__ne__)},
    **{f: (lambda a, b: a < b) for f in (torch.lt, torch.Tensor.lt, torch.Tensor.__lt__)},
    **{f: (lambda a, b: a <= b) for f in (torch.le, torch.Tensor.le, torch.Tensor.__le__)},
    **{f: (lambda a, b: a > b) for f in (torch.gt, torch.Tensor.gt, torch.Tensor.__gt__)},
    **{f: (lambda a, b: a >= b) for f in (torch.ge, torch.Tensor.ge, torch.Tensor.__ge__)},
}
_NOT = {torch.logical_not, torch.Tensor.logical_not, torch.Tensor.__invert__, torch.bitwise_not}
_AND = {torch.logical_and, torch.Tensor.logical_and, torch.Tensor.__and__, torch.bitwise_and}
_OR = {torch.logical_or, torch.Tensor.logical_or, torch.Tensor.__or__, torch.bitwise_or}
_FILLS: dict[Any, Callable[[tuple, dict], Any]] = {
    torch.full: lambda a, k: a[1] if len(a) > 1 else k.get("fill_value"),
    torch.full_like: lambda a, k: a[1] if len(a) > 1 else k.get("fill_value"),
    torch.Tensor.new_full: lambda a, k: a[2] if len(a) > 2 else k.get("fill_value"),
    torch.zeros: lambda a, k: 0.0, torch.zeros_like: lambda a, k: 0.0, torch.Tensor.new_zeros: lambda a, k: 0.0,
    torch.ones: lambda a, k: 1.0, torch.ones_like: lambda a, k: 1.0, torch.Tensor.new_ones: lambda a, k: 1.0,
    torch.tensor: lambda a, k: a[0] if a else None, torch.scalar_tensor: lambda a, k: a[0] if a else None,
}
# Every function learn() knows something of (one lookup for the ops that teach nothing).
_LEARNS = frozenset({*_TRUE_IF_FINITE, *_KEEP, *_REDUCE, *_COMPARE, *_NOT, *_AND, *_OR, *_FILLS, torch.all, torch.Tensor.all,
                     torch.any, torch.Tensor.any, torch._amp_foreach_non_finite_check_and_unscale_})
# Reads of one value, and of a whole tensor's values.
SCALAR_READS = frozenset({torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
                          torch.Tensor.__index__})
COPY_READS = frozenset({torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu})
AGREE_READS = frozenset({torch.allclose, torch.equal, torch.Tensor.allclose, torch.Tensor.equal})
SIZE_OPS = frozenset({torch.nonzero, torch.Tensor.nonzero, torch.argwhere, torch.Tensor.argwhere, torch.masked_select,
                      torch.Tensor.masked_select, torch.unique, torch.Tensor.unique, torch.Tensor.__getitem__,
                      torch.where})


def simulated(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == STAND_IN.type


class StandIns:
    """The values simulated tensors are taken to hold (see the module doc), and the reads taken."""

    def __init__(self, site: Callable[[], SourceLoc | None]) -> None:
        self.site = site
        self._known: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor → (value, why)
        self.taken: list[StandIn] = []
        self._seen: set[tuple[str, str, SourceLoc | None]] = set()

    # ---------------------------------------------------------------- learning

    def learn(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """After `func` ran on simulated tensors: what its output is known to hold."""
        if func not in _LEARNS and (out is None or not args or out is not args[0]):
            return  # most ops of a step: nothing known comes out of them, and nothing known is written
        if not simulated(out):
            if func is torch._amp_foreach_non_finite_check_and_unscale_ and len(args) > 1 and simulated(args[1]):
                self._known[args[1]] = (0.0, "GradScaler's inf check: no inf or NaN found, the optimizer steps")
            return
        first = args[0] if args else None
        if func in _TRUE_IF_FINITE:
            self._known[out] = (_TRUE_IF_FINITE[func], "finite values: no inf or NaN in a healthy step")
        elif (func in _KEEP or (func in _REDUCE and not any(isinstance(a, torch.Tensor) for a in args[1:]))) \
                and simulated(first) and first in self._known:
            value, why = self._known[first]
            self._known[out] = (bool(value) if out.dtype == torch.bool else value, why)
        elif func in _COMPARE and len(args) > 1 and isinstance(args[1], (int, float)) and simulated(first) and first in self._known:
            self._known[out] = (_COMPARE[func](self._known[first][0], args[1]), self._known[first][1])
        elif func in (torch.all, torch.Tensor.all, torch.any, torch.Tensor.any) and out.dtype == torch.bool:
            every = func in (torch.all, torch.Tensor.all)
            self._known[out] = (every, "a condition on values taken as " + ("holding for every element" if every else "holding for no element"))
        elif func in _NOT and simulated(first) and first in self._known:
            value, why = self._known[first]
            self._known[out] = (not value, why)
        elif (func in _AND or func in _OR) and len(args) > 1:
            self._logical(func in _AND, args[0], args[1], out)
        elif func in _FILLS:
            value = _FILLS[func](args, kwargs)
            # A bool only where filled explicitly (generate's stopping criteria: torch.full((b,), cur_len >= max_length)).
            explicit = isinstance(value, bool) and out.dtype == torch.bool and func in (torch.full, torch.full_like, torch.Tensor.new_full)
            if explicit or (isinstance(value, (int, float)) and not isinstance(value, bool) and out.dtype != torch.bool):
                self._known[out] = (value, "the constant the tensor was filled with")
        elif out is first and simulated(first) and first in self._known and _writes(func) and func is not torch._amp_update_scale_:
            del self._known[first]  # written in place: no longer the constant it was

    def _logical(self, conjunction: bool, a: Any, b: Any, out: torch.Tensor) -> None:
        """`a & b`, `a | b`: known where both are, or where one known side decides it (False for &, True for |):
        generate's `is_done | eos_hit` is done once the length criterion says so, whatever the tokens were."""
        known = [bool(self._known[x][0]) if simulated(x) and x in self._known else None for x in (a, b)]
        decisive = not conjunction  # the value that decides: False for &, True for |
        if decisive in known:
            self._known[out] = (decisive, self._known[(a, b)[known.index(decisive)]][1])
        elif None not in known:
            self._known[out] = (not decisive, self._known[a][1])

    # ----------------------------------------------------------------- values

    def value(self, t: torch.Tensor, reduction: str = "") -> tuple[Any, str]:
        """(one value of `t`, why): known, else by dtype."""
        if t in self._known:
            value, why = self._known[t]
        elif t.dtype == torch.bool:
            value = reduction == "all"
            why = "a condition on values taken as " + ("holding for every element" if value else "not holding (no element matches)")
        elif t.is_floating_point() or t.is_complex():
            value, why = 1.0, "a finite value (simulated tensors hold none)"
        else:
            value, why = 1, "a count (simulated tensors hold none; 1 never divides by zero)"
        return _as_dtype(value, t.dtype), why

    def read(self, func: Any, args: tuple, kwargs: dict, what: str) -> Any:
        """The stand-in for a read of values (`item`, `bool`, `tolist`, `cpu`, `numpy`, allclose)."""
        t = args[0]
        if func in AGREE_READS:
            return self._took(what, True, "the values taken as agreeing")
        if func in SCALAR_READS:
            value, why = self.value(t)
            if func is torch.Tensor.__bool__:
                value = bool(value)
            elif func is torch.Tensor.__float__:
                value = float(value)
            elif func in (torch.Tensor.__int__, torch.Tensor.__index__):
                value = int(value)
            return self._took(what, value, why)
        copy = self.host_copy(t)
        fill = copy.flatten()[0].item() if copy.numel() else None
        if _is_mask(t, self._known):
            why = MASK_WHY
        elif t in self._known or t.dtype == torch.bool:
            why = self.value(t)[1]
        else:
            why = "elements a valid index (0) or finite (1.0)"
        self._took(what, f"a {list(t.shape)} {str(t.dtype).removeprefix('torch.')} tensor of {fill}", why)
        if func is torch.Tensor.tolist:
            return copy.tolist()
        if func is torch.Tensor.numpy:
            return copy.numpy()
        return copy

    def host_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor of `t`'s shape and dtype holding its stand-in values."""
        if _is_mask(t, self._known):
            fill = True
        elif t in self._known or t.dtype == torch.bool or t.is_floating_point():
            fill = self.value(t)[0]
        else:
            fill = 0
        return torch.full(tuple(t.shape), fill, dtype=t.dtype)

    def formatted(self, t: torch.Tensor, spec: str, label: str) -> str:
        """`f"{loss:.4f}"` / `print(loss)`: the stand-in written as the script asks, the device as CUDA's."""
        if spec and t.dim() == 0:
            value, why = self.value(t)
            self._took("Tensor.__format__", value, why)
            return format(value, spec)
        text = repr(self.host_copy(t))
        self._took("Tensor.__repr__", text, "printed with stand-in values")
        return text[:-1] + f", device='{label}')" if text.endswith(")") else text

    def took_size(self, what: str, size: int) -> None:
        self._took(what, f"{size} (every element selected)", "a data-dependent size: the largest the op can give")

    def _took(self, what: str, value: Any, why: str) -> Any:
        site = self.site()
        text = value if isinstance(value, str) else repr(value)
        if (what, text, site) not in self._seen:
            self._seen.add((what, text, site))
            self.taken.append(StandIn(what, text, why, site))
        return value


def _writes(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")


def _as_dtype(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point or dtype.is_complex:
        return float(value)
    return int(value)


def sized(func: Any, args: tuple, kwargs: dict, stand_ins: StandIns) -> Any:
    """Run a data-dependent-size op on simulated tensors as if every element were selected.

    Returns the result, or NotImplemented when `func` is not one of those forms."""
    name = getattr(func, "__name__", "")
    if func is torch.Tensor.__getitem__:
        x, index = args[0], args[1]
        if not (simulated(index) and index.dtype == torch.bool and 0 < index.dim() <= x.dim()):
            return NotImplemented
        stand_ins.took_size("boolean indexing (its size)", index.numel())
        # Every element of the mask true: x[mask] is x with the masked dimensions flattened, autograd kept.
        return x.expand(*index.shape, *x.shape[index.dim():]).reshape(-1, *x.shape[index.dim():])
    if name == "where" and (len(args) != 1 or kwargs):
        return NotImplemented
    x = args[0]
    if name in ("nonzero", "argwhere", "where"):
        n = x.numel()
        stand_ins.took_size(f"torch.{name} (its size)", n)
        out = torch.empty((n, x.dim()), dtype=torch.long, device=x.device)
        if name == "where" or kwargs.get("as_tuple"):
            return tuple(out[:, i] for i in range(x.dim()))
        return out
    if name == "masked_select":
        mask = args[1] if len(args) > 1 else kwargs["mask"]
        shape = torch.broadcast_shapes(x.shape, mask.shape)
        stand_ins.took_size("torch.masked_select (its size)", int(torch.Size(shape).numel()))
        return x.expand(shape).reshape(-1)
    if name == "unique":
        n = x.numel()
        stand_ins.took_size("torch.unique (its size)", n)
        values = x.detach().reshape(-1)
        extra = []
        if kwargs.get("return_inverse") or (len(args) > 3 and args[3]):
            extra.append(torch.empty(x.shape, dtype=torch.long, device=x.device))
        if kwargs.get("return_counts") or (len(args) > 4 and args[4]):
            extra.append(torch.empty((n,), dtype=torch.long, device=x.device))
        return (values, *extra) if extra else values
    return NotImplemented


MASK_WHY = "a mask taken as selecting every element, as boolean indexing does on the simulated GPU"


def _is_mask(t: torch.Tensor, known: Any) -> bool:
    """A boolean tensor of elements copied to the host: a mask (`c[m]` for each row), which selects every
    element, as a data-dependent size does; an all-False stand-in would empty every selection (trl's GRPO
    then indexes `ids[-1]` of an empty completion). A single condition stays a condition."""
    return t.dtype == torch.bool and t.dim() > 0 and t.numel() > 1 and t not in known
