"""MoveModelToBatchDevice: the model goes where the script put its batch, never the batch to the CPU.

A model left on the CPU while the script moves its batch to the GPU it chose (`x.to(device)`)
is fixed by moving the model to that device: `model = Net()` → `model = Net().to(device)`,
where the script builds it and `device` is bound by then; else `model.to(device)` on the line
before the forward. The device is written as the script wrote it on the line that moved the
batch (its `.to(device)`, its `.cuda()`), so the patched script runs wherever the script runs.
"""

from __future__ import annotations

import libcst as cst

from dtype_doctor.fix.codemods.base import _Skip
from dtype_doctor.fix.codemods.context import _CSTCodemod, _Ctx, _method_call, dotted

_DTYPE_WORDS = ("float", "half", "bfloat16", "int", "long", "bool", "double", "dtype")


class MoveModelToBatchDevice(_CSTCodemod):
    """Move the model called on line `line` to the device the batch was moved to on `moved_at`
    (`.to(device)` / `.cuda()` there). `builders`: the names a call that builds the model ends in
    (its class, `from_pretrained`), to find where the script builds it when the forward's model
    is a parameter of the function that calls it."""

    DESCRIPTION = "Move the model to the device the script moved its batch to (never the batch off the GPU)."

    def __init__(self, line: int, moved_at: int | None, builders: tuple[str, ...] = ()):
        self.line = line
        self.moved_at = moved_at
        self.builders = tuple(builders)

    def _edit(self, ctx: _Ctx) -> str:
        from dtype_doctor.fix.codemods.forward import _select_forward

        if not self.line:  # no forward in this file (the model's own generate() calls it): after the set-up
            return self._after_set_up(ctx, self._move(ctx))
        fwd = _select_forward(ctx, None, self.line)
        model = fwd.model
        move = self._move(ctx)
        built = self._built(ctx, fwd.call, model)
        if built is not None and self._bound_before(ctx, built, move):
            value = built.value
            ctx.replace(value, _moved(ctx, value, move))
            return f"{ctx.filename}:{ctx.line(built)}: the model is built on the batch's device: `{ctx.snippet(value, 40)}` now ends in .{_shown(move)}"
        stmt = fwd.stmt
        line = f"{model}.{_shown(move)}\n"
        ctx.insert_before(stmt, [ctx.parse_stmt(line)])
        return f"{ctx.filename}:{fwd.line}: `{line.strip()}` before the forward: the model goes to the batch's device"

    def _move(self, ctx: _Ctx) -> tuple[str, str | None]:
        """("to", "device") or ("cuda", None): how the script moved its batch on `moved_at`."""
        if self.moved_at is not None:
            for node in ctx.nodes:
                if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and ctx.covers(node, self.moved_at)):
                    continue
                method = node.func.attr.value
                if method == "cuda":
                    return ("cuda", ctx.code(node.args[0].value) if node.args else None)
                made = next((a for a in node.args if a.keyword is not None and a.keyword.value == "device"), None)
                if made is not None and method != "to":  # made there: `torch.tensor(ids, device=device)[None, ...]`
                    return ("to", ctx.code(made.value))
                if method == "to" and node.args and node.args[0].keyword in (None, "device"):
                    expr = ctx.code(node.args[0].value)
                    if not any(w in expr.rpartition(".")[2].lower() for w in _DTYPE_WORDS):
                        return ("to", expr)
        raise _Skip(f"{ctx.filename}:{self.moved_at}: no .to(device) or .cuda() there to say where the batch went")

    def _after_set_up(self, ctx: _Ctx, move: tuple[str, str | None]) -> str:
        """`model.to(device)` after the top-level statement that builds the model (a builder's call, in
        an if/elif of several) and the calls that set it up right after it (`model.eval()`)."""
        built = [n for n in ctx.nodes if isinstance(n, cst.Assign) and len(_targets(n)) == 1 and _builder(n.value) in self.builders
                 and (self.moved_at is None or ctx.line(n) < self.moved_at)]
        names = {_targets(n)[0] for n in built}
        if len(names) != 1 or not next(iter(names)):
            raise _Skip(f"{ctx.filename}: no one model built by {', '.join(self.builders) or 'a known builder'} before the batch")
        model = names.pop()
        body = list(ctx.module.body)
        top = [i for i, stmt in enumerate(body) if any(ctx.covers(stmt, ctx.line(n)) for n in built)]
        if not top:
            raise _Skip(f"{ctx.filename}: the model `{model}` is built inside a function, not where the script runs")
        at = top[-1]
        while at + 1 < len(body) and _sets_up(body[at + 1], model):
            at += 1
        line = f"{model}.{_shown(move)}\n"
        ctx.insert_after(body[at], [ctx.parse_stmt(line)])
        return f"{ctx.filename}:{ctx.line(body[at])}: `{line.strip()}` after the model is built and set up: the model goes to the batch's device"

    def _built(self, ctx: _Ctx, call: cst.Call, model: str) -> cst.Assign | None:
        """The assignment that builds the model: the last `model = ...` before the forward in its
        function, else (the model a parameter there) the one call in the file of a builder."""
        scope = _function_of(ctx, call)
        mine = [n for n in ctx.nodes if isinstance(n, cst.Assign) and _targets(n) == [model]
                and _function_of(ctx, n) is scope and ctx.line(n) < ctx.line(call)]
        if mine:
            return mine[-1]
        if not self.builders:
            return None
        built = [n for n in ctx.nodes if isinstance(n, cst.Assign) and len(_targets(n)) == 1
                 and _builder(n.value) in self.builders]
        return built[0] if len(built) == 1 else None

    def _bound_before(self, ctx: _Ctx, at: cst.Assign, move: tuple[str, str | None]) -> bool:
        """Whether the device expression's names are bound in `at`'s scope before `at`."""
        method, expr = move
        if expr is None:
            return True
        root = expr.split(".")[0].split("(")[0].strip()
        if not root.isidentifier() or root in ("torch",) or expr.startswith(("'", '"')):
            return True
        scope = _function_of(ctx, at)
        if isinstance(scope, cst.FunctionDef) and any(p.name.value == root for p in (*scope.params.params, *scope.params.kwonly_params)):
            return True
        return any(isinstance(n, cst.Assign) and root in _targets(n) and ctx.line(n) < ctx.line(at)
                   and _function_of(ctx, n) in (scope, None) for n in ctx.nodes)


def _sets_up(stmt: cst.CSTNode, model: str) -> bool:
    """`model.eval()` / `model.load_state_dict(...)`: one call of a method of the model, alone on its line."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)):
        return False
    call = stmt.body[0].value
    return (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name)
            and call.func.value.value == model)


def _function_of(ctx: _Ctx, node: cst.CSTNode) -> cst.FunctionDef | None:
    return next((a for a in ctx.ancestors(node) if isinstance(a, cst.FunctionDef)), None)


def _targets(assign: cst.Assign) -> list[str]:
    names: list[str] = []
    for t in assign.targets:
        target = t.target
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]
        names += [e.value.value if isinstance(e, cst.Element) and isinstance(e.value, cst.Name) else
                  e.value if isinstance(e, cst.Name) else "" for e in elements]
    return names


def _builder(value: cst.BaseExpression) -> str:
    """`Net` for `Net(...)`, `from_pretrained` for `AutoModel.from_pretrained(...)` (through `.to(...)` chains)."""
    while isinstance(value, cst.Call):
        inner = value.func
        if isinstance(inner, cst.Attribute) and isinstance(inner.value, cst.Call):
            value = inner.value
            continue
        return (dotted(inner) or "").rpartition(".")[2]
    return ""


def _moved(ctx: _Ctx, value: cst.BaseExpression, move: tuple[str, str | None]) -> cst.Call:
    method, expr = move
    return _method_call(value, method, [cst.Arg(ctx.parse_expr(expr))] if expr else [])


def _shown(move: tuple[str, str | None]) -> str:
    method, expr = move
    return f"{method}({expr or ''})"


class MoveModelWherePlaced(_CSTCodemod):
    """One of several models left behind (`text_encoder.to(dtype=weight_dtype)` beside
    `vae.to(accelerator.device, dtype=weight_dtype)`): the device goes into that model's own `.to(...)`
    on `line`, written as the script wrote it for the batch on `moved_at`, else for the sibling models
    it moved in the same function."""

    DESCRIPTION = "Move one of several models where the script places it, to the device of the others."

    def __init__(self, line: int, moved_at: int | None = None):
        self.line = line
        self.moved_at = moved_at

    def _edit(self, ctx: _Ctx) -> str:
        call = next((n for n in ctx.nodes if _is_to(n) and ctx.covers(n, self.line)), None)
        if call is None or _device_arg(ctx, call) is not None:
            raise _Skip(f"{ctx.filename}:{self.line}: no .to(...) without a device there")
        device = self._device(ctx, call)
        args = [cst.Arg(cst.parse_expression(device)), *call.args]
        ctx.replace(call, call.with_changes(args=args))
        return f"{ctx.filename}:{self.line}: `{ctx.code(call.func)}(...)` now names {device}, where the other models went"

    def _device(self, ctx: _Ctx, call: cst.Call) -> str:
        try:
            method, expr = MoveModelToBatchDevice(self.line, self.moved_at)._move(ctx)
            if method == "to" and expr:
                return expr
        except _Skip:
            pass
        scope = _function_of(ctx, call)
        siblings = [(abs(ctx.line(n) - self.line), d) for n in ctx.nodes if _is_to(n) and n is not call
                    and _function_of(ctx, n) is scope and (d := _device_arg(ctx, n)) is not None]
        if not siblings:
            raise _Skip(f"{ctx.filename}:{self.line}: no other model moved with .to(device) in that function")
        return min(siblings)[1]


def _is_to(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "to"


def _device_arg(ctx: _Ctx, call: cst.Call) -> str | None:
    """The device a `.to(...)` names: its `device=`, or a first positional argument that is no dtype."""
    for i, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == "device":
            return ctx.code(arg.value)
        if i == 0 and arg.keyword is None:
            expr = ctx.code(arg.value)
            if not any(w in expr.rpartition(".")[2].lower() for w in _DTYPE_WORDS):
                return expr
    return None
