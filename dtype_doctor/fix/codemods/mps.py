"""A float64 tensor cast to float32 before it is copied to Apple's MPS device: CastBeforeMove.

A Mac refuses the copy itself (`x.to("mps")` of a float64 tensor raises), so a cast after it
(at the model call, or `.to(device).float()`) comes too late: the cast goes on the tensor the
move is called on, or where numpy's float64 enters (`torch.from_numpy(a)`), or, on a line that
makes the tensor without moving it, at the end of the value made there.
"""

from __future__ import annotations

import libcst as cst

from dtype_doctor.fix.codemods.base import _Skip, normalize_dtype
from dtype_doctor.fix.codemods.casts import dtype_of
from dtype_doctor.fix.codemods.context import _append_arg, _arg_name, _CSTCodemod, _Ctx, _kwarg, _method_call, dotted
from dtype_doctor.fix.codemods.devices import CastWhereMade, _values
from dtype_doctor.fix.codemods.forward import _moves_device


def _moves_on(ctx: _Ctx, line: int) -> list[cst.Call]:
    """The calls on `line` that move a tensor to a device (`.to(device)`, `.cuda()`, `.mps()`), outermost last."""
    def moves(n: cst.CSTNode) -> bool:
        if not isinstance(n, cst.Call) or ctx.line(n) != line:
            return False
        return _moves_device(ctx, n) or (isinstance(n.func, cst.Attribute) and n.func.attr.value == "mps")
    found = [n for n in ctx.nodes if moves(n)]
    # `x.to(device).to(device)`: the innermost move is the copy a Mac refuses.
    return [m for m in found if not any(isinstance(m.func, cst.Attribute) and m.func.value is o for o in found)]


def _made_on_device(ctx: _Ctx, line: int) -> list[cst.Call]:
    """torch factory calls on `line` given device= and no dtype= (`torch.tensor(a, device=device)`)."""
    return [
        n for n in ctx.nodes
        if isinstance(n, cst.Call) and ctx.line(n) == line and (dotted(n.func) or "").rpartition(".")[2] in ("tensor", "as_tensor")
        and any(_arg_name(a) == "device" for a in n.args) and not any(_arg_name(a) == "dtype" or a.star for a in n.args)
    ]


def _torch_call(ctx: _Ctx, call: cst.Call) -> bool:
    """A call of torch's (`torch.stack(...)`, under the name the file imports torch as) or a method of a
    tensor (`x.double()`): not a class (`TensorDataset(...)`) nor numpy's, whose value is no tensor to cast."""
    name = dotted(call.func) or ""
    head, last = name.partition(".")[0], name.rpartition(".")[2]
    if head in ("torch", ctx.imports.top_level_torch):
        return True
    return isinstance(call.func, cst.Attribute) and last[:1].islower() and head not in ("np", "numpy", "pd", "pandas")


def _brings_data(ctx: _Ctx, call: cst.Call) -> bool:
    """torch.from_numpy / torch.tensor / torch.as_tensor: where outside data (numpy's float64) enters torch."""
    name = dotted(call.func) or ""
    head, _, last = name.rpartition(".")
    return last in ("from_numpy", "tensor", "as_tensor") and head in ("torch", ctx.imports.top_level_torch, "")


def _cast_already(ctx: _Ctx, expr: cst.BaseExpression, dtype: str) -> bool:
    """expr ends in a cast to `dtype` (`.float()`, `.to(torch.float32)`)."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    if expr.func.attr.value == "float" and dtype == "float32":
        return True
    return expr.func.attr.value == "to" and any((dtype_of(a.value, ctx.imports) or ("", ""))[1] == dtype for a in expr.args)


class CastBeforeMove(_CSTCodemod):
    """Cast a tensor to `dtype` before the line's move to the device: ``x = torch.tensor(a).to(device)``
    → ``x = torch.tensor(a).to(torch.float32).to(device)``; ``torch.from_numpy(a)`` cast where numpy's
    dtype enters; ``torch.tensor(a, device=device)`` given dtype=. A line that makes the tensor without
    moving it: CastWhereMade. Several moves on the line: `nth` picks one (None: skipped, which is unknown)."""

    DESCRIPTION = "Cast the float64 tensor to float32 before it is copied to the device (a Mac refuses the copy)."

    def __init__(self, line: int, dtype: str = "float32", nth: int | None = None):
        self.line = line
        self.dtype = normalize_dtype(dtype)
        self.nth = nth

    def _edit(self, ctx: _Ctx) -> str:
        to = f"{ctx.torch_name()}.{self.dtype}"
        entering = [n for n in ctx.nodes if isinstance(n, cst.Call) and ctx.line(n) == self.line
                    and (dotted(n.func) or "").endswith("from_numpy")]
        moves, made = _moves_on(ctx, self.line), _made_on_device(ctx, self.line)
        if not moves and not made:
            if self.nth is not None:
                raise _Skip(f"{ctx.filename}:{self.line}: no move to a device on that line")
            return self._where_made(ctx, to)
        carried = [m.func.value for m in moves if isinstance(m.func, cst.Attribute)]
        if len(carried) == 1 and self.nth is None and _cast_already(ctx, carried[0], self.dtype):
            raise _Skip(f"{ctx.filename}:{self.line}: `{ctx.snippet(carried[0], 40)}` is already cast to {to} before its move")
        if len(entering) == 1 and len(moves) <= 1 and not made and self.nth is None:
            value = entering[0]
        elif made and not moves and len(made) == 1 and self.nth is None:
            call = made[0]
            ctx.replace(call, lambda updated: _append_arg(updated, _kwarg("dtype", ctx.parse_expr(to))))
            return f"{ctx.filename}:{self.line}: `{ctx.snippet(call, 40)}` now makes {to}"
        else:
            value = self._receiver(ctx, moves)
        if _cast_already(ctx, value, self.dtype):
            raise _Skip(f"{ctx.filename}:{self.line}: `{ctx.snippet(value, 40)}` is already cast to {to}")
        ctx.replace(value, _method_call(value, "to", [cst.Arg(ctx.parse_expr(to))]))
        return f"{ctx.filename}:{self.line}: `{ctx.snippet(value, 40)}` now ends in .to({to}), before its move"

    def _where_made(self, ctx: _Ctx, to: str) -> str:
        """A line that makes the tensor without moving it: the one call there that brings data into torch
        (`torch.tensor(X)` gets dtype=), else the value a torch call or a subscript makes (CastWhereMade).
        A value some other call builds (`TensorDataset(torch.tensor(X), ...)`) is no tensor to cast."""
        entries = [n for n in ctx.nodes if isinstance(n, cst.Call) and ctx.line(n) == self.line and _brings_data(ctx, n)]
        if len(entries) > 1:
            shown = ", ".join(f"`{ctx.snippet(e, 30)}`" for e in entries)
            raise _Skip(f"{ctx.filename}:{self.line}: {len(entries)} tensors are made there ({shown}); which one is not known")
        if entries and (dotted(entries[0].func) or "").endswith("from_numpy"):
            return CastWhereMade(self.line, self.dtype)._edit(ctx)
        if entries:
            call = entries[0]
            if any(_arg_name(a) == "dtype" or a.star for a in call.args):
                raise _Skip(f"{ctx.filename}:{self.line}: `{ctx.snippet(call, 40)}` names its dtype already")
            ctx.replace(call, lambda updated: _append_arg(updated, _kwarg("dtype", ctx.parse_expr(to))))
            return f"{ctx.filename}:{self.line}: `{ctx.snippet(call, 40)}` now makes {to}"
        values = _values(ctx, self.line)
        if len(values) != 1 or (isinstance(values[0], cst.Call) and not _torch_call(ctx, values[0])):
            raise _Skip(f"{ctx.filename}:{self.line}: no tensor made there that a cast can follow")
        return CastWhereMade(self.line, self.dtype)._edit(ctx)

    def _receiver(self, ctx: _Ctx, moves: list[cst.Call]) -> cst.BaseExpression:
        if self.nth is None and len(moves) > 1:
            shown = ", ".join(f"`{ctx.snippet(m, 30)}`" for m in moves)
            raise _Skip(f"{ctx.filename}:{self.line}: {len(moves)} moves could carry the tensor ({shown}); which one is not known")
        if self.nth is not None and (len(moves) < 2 or self.nth >= len(moves)):
            raise _Skip(f"{ctx.filename}:{self.line}: no move number {self.nth + 1} of several on that line")
        move = moves[self.nth or 0]
        if not isinstance(move.func, cst.Attribute):
            raise _Skip(f"{ctx.filename}:{self.line}: `{ctx.snippet(move, 30)}` moves no tensor it is called on")
        return move.func.value
