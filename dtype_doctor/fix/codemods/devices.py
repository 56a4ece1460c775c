"""Codemods that put a tensor on the device it is used on, at the line that made or last handled it:
AddDevice (a factory called without device=) and MoveWhereHandled (a move the script dropped); and
CastWhereMade, which gives a tensor its dtype on the line that made it when no cast there can be
rewritten (`.astype(target_type)`, a dtype held by a variable).

The device is written with what the code has at that line, never a literal "cuda:0": a `device`
the function defines, the forward's input (`idx.device`), a buffer or a parameter of `self`, or
the script's `device` variable.
"""

from __future__ import annotations

import libcst as cst

from dtype_doctor.fix.codemods.base import _Skip
from dtype_doctor.fix.codemods.context import _append_arg, _arg_name, _CSTCodemod, _Ctx, _kwarg, _method_call, dotted

# The factories a forward calls to make a tensor (run/step_inputs.py notes the ones called without device=).
FACTORIES = frozenset({
    "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint", "randperm", "eye", "linspace", "logspace",
    "tensor", "as_tensor",
})


def _enclosing(ctx: _Ctx, node: cst.CSTNode, kind: type) -> cst.CSTNode | None:
    return next((a for a in ctx.ancestors(node) if isinstance(a, kind)), None)


def _binds(ctx: _Ctx, fn: cst.FunctionDef, name: str) -> bool:
    """Whether `fn` itself (not a def nested in it) binds `name`: a parameter, or a target it assigns."""
    if any(p.name.value == name for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)):
        return True
    for node in ctx.nodes:
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.For)):
            targets = [node.target]
        if targets and _enclosing(ctx, node, cst.FunctionDef) is fn:
            if any(isinstance(n, cst.Name) and n.value == name for t in targets for n in [t, *_walk(t)]):
                return True
    return False


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    from dtype_doctor.source.analysis import walk

    return walk(node)


def _buffers(cls: cst.ClassDef) -> list[str]:
    """The buffers a module class registers: `self.register_buffer("inv_freq", ...)`."""
    names = []

    class Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if dotted(node.func) == "self.register_buffer" and node.args and isinstance(node.args[0].value, cst.SimpleString):
                names.append(node.args[0].value.evaluated_value)

    cls.visit(Find())
    return [n for n in names if isinstance(n, str) and n.isidentifier()]


def device_in_scope(ctx: _Ctx, node: cst.CSTNode) -> str | None:
    """How the code at `node` can name the device its tensors are on: a `device` its function
    defines, the forward's first input, a buffer or parameter of `self`, or a global `device`."""
    fn = _enclosing(ctx, node, cst.FunctionDef)
    if isinstance(fn, cst.FunctionDef):
        if _binds(ctx, fn, "device"):
            return "device"
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
        method = bool(params) and params[0] == "self"
        if method and fn.name.value == "forward" and len(params) > 1:
            return f"{params[1]}.device"
        cls = _enclosing(ctx, fn, cst.ClassDef)
        if method and isinstance(cls, cst.ClassDef) and _is_module(cls):
            buffers = _buffers(cls)
            return f"self.{buffers[0]}.device" if buffers else "next(self.parameters()).device"
    return script_device(ctx, node) or ("device" if ctx.scope_has(node, "device") else None)


def _is_module(cls: cst.ClassDef) -> bool:
    """Whether a class is an nn.Module (has parameters to ask): a base named *Module / *Model, or a forward."""
    bases = [(dotted(b.value) or "").rpartition(".")[2] for b in cls.bases]
    if any(b.endswith(("Module", "Model", "Sequential", "ModuleList", "ModuleDict")) for b in bases):
        return True
    return any(isinstance(s, cst.FunctionDef) and s.name.value == "forward" for s in cls.body.body)


def script_device(ctx: _Ctx, node: cst.CSTNode) -> str | None:
    """The device the script itself moves things to near `node` (`self.device` in a Trainer that
    does `model.to(self.device)`, `args.device`, `device`): the first argument of its `.to(...)`
    calls, the enclosing class's first, then the file's; never a dtype."""
    cls = _enclosing(ctx, node, cst.ClassDef)
    for scope in ([cls] if cls is not None else []) + [None]:
        for n in ctx.nodes:
            if not (isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "to" and n.args):
                continue
            if scope is not None and _enclosing(ctx, n, cst.ClassDef) is not scope:
                continue
            name = dotted(n.args[0].value)
            if n.args[0].keyword is None and name and name.rpartition(".")[2] in ("device", "dev") and _names_in_scope(ctx, node, name):
                return name
    return None


def _names_in_scope(ctx: _Ctx, node: cst.CSTNode, name: str) -> bool:
    """`self.device` can be said in a method of the same class; `args.device`/`device` where `args`/`device` is in scope."""
    return ctx.scope_has(node, name.partition(".")[0])


def _elements_moved_after(ctx: _Ctx, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """`batch = next(data_iter)` then `batch = [t for t in batch]` (minGPT's Trainer with its
    `.to(self.device)` dropped): the comprehension's element, where the script moves each tensor of a
    batch it holds as a list. None when no comprehension over the name follows in the same function."""
    stmt = next((a for a in ctx.ancestors(value) if isinstance(a, cst.Assign)), None)
    if stmt is None or len(stmt.targets) != 1 or not isinstance(stmt.targets[0].target, cst.Name):
        return None
    name, fn, line = stmt.targets[0].target.value, _enclosing(ctx, stmt, cst.FunctionDef), ctx.line(stmt)
    comps = [
        n for n in ctx.nodes
        if isinstance(n, (cst.ListComp, cst.GeneratorExp)) and ctx.line(n) > line and _enclosing(ctx, n, cst.FunctionDef) is fn
        and isinstance(n.for_in.iter, cst.Name) and n.for_in.iter.value == name and n.for_in.inner_for_in is None
    ]
    return min(comps, key=ctx.line).elt if comps else None


def _factory_name(ctx: _Ctx, call: cst.Call) -> str | None:
    """`arange` for a call of torch.arange (under the name the file imports torch as), or of a bare
    factory name (`from torch import arange`)."""
    name = dotted(call.func)
    if name is None:
        return None
    head, _, last = name.rpartition(".")
    if head in ("torch", ctx.imports.top_level_torch):
        return last
    return last if not head and last in FACTORIES else None


class AddDevice(_CSTCodemod):
    """Give a factory the model code calls without device= the device of what it meets:
    ``torch.arange(0, t, dtype=torch.long)`` → ``torch.arange(0, t, dtype=torch.long, device=device)``
    on the line the run named (``device`` as :func:`device_in_scope` finds it there), and on the calls
    of the same factory in the statement that holds it: an LSTM's ``(torch.zeros(...), torch.zeros(...))``
    state is one statement, and the run sees its tensors as one origin."""

    DESCRIPTION = "Create the tensor on the device of the tensors it meets: device= on the factory call the run named."

    def __init__(self, line: int, factory: str, device_expr: str | None = None):
        self.line = line
        self.factory = factory
        self.device_expr = device_expr

    def _edit(self, ctx: _Ctx) -> str:
        named = [n for n in ctx.nodes if isinstance(n, cst.Call) and ctx.line(n) == self.line and _factory_name(ctx, n) == self.factory]
        statements = [n for n in ctx.nodes if isinstance(n, cst.SimpleStatementLine) and any(ctx.covers(n, ctx.line(c)) for c in named)]
        calls = [
            n for n in ctx.nodes
            if isinstance(n, cst.Call) and _factory_name(ctx, n) == self.factory
            and (ctx.line(n) == self.line or any(ctx.covers(st, ctx.line(n)) for st in statements))
            and not any(_arg_name(a) == "device" or a.star == "**" for a in n.args)
        ]
        if not calls:
            raise _Skip(f"{ctx.filename}:{self.line}: no torch.{self.factory}(...) without device= on that line")
        changes = []
        for call in calls:
            device = self.device_expr or device_in_scope(ctx, call)
            if device is None:
                raise _Skip(f"{ctx.filename}:{self.line}: nothing in scope names a device for torch.{self.factory}")
            value = ctx.parse_expr(device)
            ctx.replace(call, lambda updated, value=value: _append_arg(updated, _kwarg("device", value)))
            changes.append(f"device={device}")
        return f"{ctx.filename}:{self.line}: torch.{self.factory}(..., {', '.join(changes)})"


def _values(ctx: _Ctx, line: int) -> list[cst.BaseExpression]:
    """The values the statements on `line` assign or return (each element of a tuple apart)."""
    stmts = [n for n in ctx.nodes if isinstance(n, (cst.Assign, cst.AnnAssign, cst.Return, cst.Expr)) and ctx.line(n) == line]
    if not stmts:
        raise _Skip(f"{ctx.filename}:{line}: no assignment or return on that line")
    values: list[cst.BaseExpression] = []
    for stmt in stmts:
        value = stmt.value
        if value is None:
            continue
        values += [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
    return values


def _moves(ctx: _Ctx, expr: cst.BaseExpression) -> cst.Call | None:
    """The `.to(...)`/`.cuda()` call that ends `expr`, when it moves it to a device (not only a dtype)."""
    from dtype_doctor.fix.codemods.forward import _moves_device

    return expr if isinstance(expr, cst.Call) and _moves_device(ctx, expr) else None


def _calls(call: str) -> tuple[str, bool]:
    """(".pin_memory()" → ("pin_memory", method); "torch.stack" → ("stack", function))."""
    if call.startswith("."):
        return call.strip(".()"), True
    return call.rpartition(".")[2], False


def _made_by(expr: cst.BaseExpression, call: str) -> bool:
    name, method = _calls(call)
    if not isinstance(expr, cst.Call):
        return False
    func = expr.func
    if method:
        return isinstance(func, cst.Attribute) and func.attr.value == name
    return (dotted(func) or "").rpartition(".")[2] == name


class MoveWhereHandled(_CSTCodemod):
    """Move a tensor to the device on the last line of the user's that handled it before the step
    took it, where the script dropped the move: ``x, y = x.pin_memory().to(device, non_blocking=True),
    y.pin_memory()`` → ``..., y.pin_memory().to(device, non_blocking=True)`` (a move beside it on the
    line lends its arguments; else ``.to(device)`` with the device in scope). `call` (".pin_memory()",
    "torch.stack") picks the value on the line that made the tensor."""

    DESCRIPTION = "Move the tensor to the device where the script last handled it (the .to(device) it dropped)."

    def __init__(self, line: int, call: str | None = None, device_expr: str | None = None):
        self.line = line
        self.call = call
        self.device_expr = device_expr

    def _edit(self, ctx: _Ctx) -> str:
        values = _values(ctx, self.line)
        moved = [m for v in values if (m := _moves(ctx, v)) is not None]
        candidates = [v for v in values if _moves(ctx, v) is None and isinstance(v, (cst.Call, cst.Name, cst.Subscript, cst.Attribute))]
        if self.call is not None and len(candidates) > 1:
            candidates = [v for v in candidates if _made_by(v, self.call)] or candidates
        if not candidates:
            raise _Skip(f"{ctx.filename}:{self.line}: every value on that line already moves to a device")
        if len(candidates) > 1:
            shown = ", ".join(f"`{ctx.snippet(v, 30)}`" for v in candidates)
            raise _Skip(f"{ctx.filename}:{self.line}: {len(candidates)} values could be the tensor ({shown}); which one is not known")
        value = candidates[0]
        if isinstance(value, cst.Call) and dotted(value.func) == "next":
            # A batch the script holds as a list or tuple has no .to: move each element where the script walks it.
            value = _elements_moved_after(ctx, value)
            if value is None or _moves(ctx, value) is not None:
                raise _Skip(f"{ctx.filename}:{self.line}: `next(...)` hands out a batch container, not a tensor; no element to move")
        if self.device_expr is not None:
            args: list[cst.Arg] = [cst.Arg(ctx.parse_expr(self.device_expr))]
        elif moved and isinstance(moved[0].func, cst.Attribute) and moved[0].func.attr.value == "to":
            args = list(moved[0].args)  # the move beside it, as the script wrote it: `.to(device, non_blocking=True)`
        else:
            device = device_in_scope(ctx, value)
            if device is None:
                raise _Skip(f"{ctx.filename}:{self.line}: no `device` in scope to move `{ctx.snippet(value, 30)}` to")
            args = [cst.Arg(ctx.parse_expr(device))]
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(list(args)) - 1 else a for i, a in enumerate(args)]
        ctx.replace(value, _method_call(value, "to", args))
        move = cst.Module([]).code_for_node(cst.Call(func=cst.Name("to"), args=args))
        return f"{ctx.filename}:{ctx.line(value)}: `{ctx.snippet(value, 40)}` now ends in .{move}"


class CastWhereMade(_CSTCodemod):
    """Give a tensor its dtype on the line that made it, where no cast there can be rewritten:
    ``y = torch.stack([... .astype(target_type) ...])`` → ``y = torch.stack([...]).to(torch.int64)``.
    `call` picks the value on the line, as for MoveWhereHandled."""

    DESCRIPTION = "Cast the tensor to the dtype its consumer needs on the line that made it."

    def __init__(self, line: int, dtype: str, call: str | None = None):
        from dtype_doctor.fix.codemods.base import normalize_dtype

        self.line = line
        self.dtype = normalize_dtype(dtype)
        self.call = call

    def _edit(self, ctx: _Ctx) -> str:
        values = [v for v in _values(ctx, self.line) if isinstance(v, (cst.Call, cst.Name, cst.Subscript, cst.Attribute))]
        if self.call is not None and len(values) > 1:
            values = [v for v in values if _made_by(v, self.call)] or values
        if not values:
            raise _Skip(f"{ctx.filename}:{self.line}: no value on that line to cast")
        if len(values) > 1:
            shown = ", ".join(f"`{ctx.snippet(v, 30)}`" for v in values)
            raise _Skip(f"{ctx.filename}:{self.line}: {len(values)} values could be the tensor ({shown}); which one is not known")
        value = values[0]
        to = f"{ctx.torch_name()}.{self.dtype}"
        if ctx.code(value).endswith(f".to({to})"):
            raise _Skip(f"{ctx.filename}:{self.line}: `{ctx.snippet(value, 40)}` is already cast to {to}")
        # Where numpy's dtype enters (`torch.from_numpy(x)`, float64 by numpy's default): cast there, before any move.
        entry = [n for n in ctx.nodes if isinstance(n, cst.Call) and (dotted(n.func) or "").endswith("from_numpy")
                 and (n is value or any(a is value for a in ctx.ancestors(n)))]
        if len(entry) == 1 and entry[0] is not value and self.dtype.startswith(("float", "bfloat")):
            value = entry[0]
        ctx.replace(value, _method_call(value, "to", [cst.Arg(ctx.parse_expr(to))]))
        return f"{ctx.filename}:{self.line}: `{ctx.snippet(value, 40)}` now ends in .to({to})"
