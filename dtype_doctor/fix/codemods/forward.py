"""Codemods that edit a script's forward call site: WrapForwardInAutocast, MoveBatchToDevice,
CastBatch, LabelsToLong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from dtype_doctor.fix.codemods.base import HALF, _Skip, normalize_dtype
from dtype_doctor.fix.codemods.casts import dtype_of, _label_int_sites, _rewrite_sites
from dtype_doctor.fix.codemods.context import _arg_name, _CSTCodemod, _Ctx, dotted, _method_call
from dtype_doctor.fix.codemods.model import _model_names
from dtype_doctor.source.bindings import FORWARD_ENTRIES


# --- the forward call


def _is_autocast(ctx: _Ctx, expr: cst.BaseExpression) -> bool:
    target = expr.func if isinstance(expr, cst.Call) else expr
    name = dotted(target) or ctx.code(target)
    return name.split(".")[-1] == "autocast"


def _autocast_around(ctx: _Ctx, node: cst.CSTNode) -> tuple[int, bool] | None:
    """(line, enabled) of the `with ...autocast(...)` (or autocast decorator) node runs under."""
    for anc in ctx.ancestors(node):
        exprs: list[cst.BaseExpression] = []
        if isinstance(anc, cst.With):
            exprs = [item.item for item in anc.items]
        elif isinstance(anc, cst.FunctionDef):
            exprs = [d.decorator for d in anc.decorators]
        for expr in exprs:
            if _is_autocast(ctx, expr):
                disabled = isinstance(expr, cst.Call) and any(
                    _arg_name(a) == "enabled" and isinstance(a.value, cst.Name) and a.value.value == "False"
                    for a in expr.args
                )
                return ctx.line(anc), not disabled
    return None


@dataclass(frozen=True)
class _Forward:
    call: cst.Call
    model: str  # how the model is written at the call: "model", "self.model"
    stmt: cst.SimpleStatementLine
    line: int




def _select_forward(ctx: _Ctx, variable: str | None, line: int | None) -> _Forward:
    names, _ = _model_names(ctx, variable, fallback=True)
    calls = []
    for node in ctx.nodes:
        if not isinstance(node, cst.Call):
            continue
        callee = ctx.code(node.func)
        if callee in names:
            calls.append((node, callee))
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in FORWARD_ENTRIES:
            owner = ctx.code(node.func.value)
            if owner in names:
                calls.append((node, owner))
    shown = ", ".join(f"`{n}`" for n in sorted(names))
    if line is not None:
        calls = [c for c in calls if ctx.covers(c[0], line)]
    if not calls:
        where = f" on line {line}" if line is not None else ""
        raise _Skip(f"no forward call of {shown} found in {ctx.filename}{where}")
    if len(calls) > 1:
        lines = ", ".join(str(ctx.line(c)) for c, _ in calls)
        raise _Skip(
            f"ambiguous: {len(calls)} forward calls of {shown} in {ctx.filename} (lines {lines}); pass line= to choose"
        )
    call, model = calls[0]
    cur: cst.CSTNode = call
    while not isinstance(cur, cst.SimpleStatementLine):
        parent = ctx.parent(cur)
        if isinstance(parent, cst.SimpleStatementSuite):
            raise _Skip(
                f"{ctx.filename}:{ctx.line(call)}: the forward call shares its line with a for/if/with header; "
                "put it on a line of its own"
            )
        if parent is None or isinstance(parent, cst.BaseCompoundStatement):
            raise _Skip(f"{ctx.filename}:{ctx.line(call)}: the forward call is part of a for/if/while/with header")
        cur = parent
    return _Forward(call, model, cur, ctx.line(call))


def _binds(ctx: _Ctx, stmt: cst.SimpleStatementLine, word: str) -> bool:
    for small in stmt.body:
        targets: list[cst.BaseExpression] = []
        if isinstance(small, cst.Assign):
            targets = [t.target for t in small.targets]
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            targets = [small.target]
        if any(word in ctx.code(t).lower() for t in targets):
            return True
    return False


class WrapForwardInAutocast(_CSTCodemod):
    """Wrap the forward statement (through the loss) in ``with torch.autocast(...):``.

    The forward is the one call of the model (``model(**batch)``, ``model(input_ids=...)``,
    ``model(**inputs).loss``, ``model.forward(...)``), anywhere: top level, loop, function.
    Following simple statements up to the first one that assigns a ``*loss*`` name are
    wrapped too, never a ``.backward()`` / optimizer step. Comments above the forward stay
    above the ``with``. Skipped when already under autocast, when there are several
    forward calls (``line`` picks one), or when the call sits in a compound header.
    """

    DESCRIPTION = "Run the model's forward (through the loss computation) under torch.autocast."

    _LOOKAHEAD = 6

    def __init__(
        self, device_type: str = "cuda", dtype: str = "float16", *, variable: str | None = None, line: int | None = None
    ):
        if not re.fullmatch(r"[a-z_]+", device_type):
            raise ValueError(f"device_type is a device kind like 'cuda' or 'cpu', not {device_type!r}")
        self.device_type = device_type
        self.dtype = normalize_dtype(dtype)
        if self.dtype not in HALF:
            raise ValueError(f"autocast runs in float16 or bfloat16, not {dtype!r}")
        self.variable = variable
        self.line = line

    def _edit(self, ctx: _Ctx) -> str:
        fwd = _select_forward(ctx, self.variable, self.line)
        under = _autocast_around(ctx, fwd.call)
        if under is not None:
            where, enabled = under
            if not enabled:
                raise _Skip(
                    f"{ctx.filename}:{fwd.line}: the forward runs under autocast(enabled=False) (line {where}); "
                    "left as the script chose"
                )
            raise _Skip(f"{ctx.filename}:{fwd.line}: the forward is already under torch.autocast (line {where})")
        block = ctx.parent(fwd.stmt)
        body = list(block.body)  # type: ignore[union-attr]
        start = next(i for i, s in enumerate(body) if s is fwd.stmt)
        end = start
        if not _binds(ctx, fwd.stmt, "loss"):
            for k in range(start + 1, min(len(body), start + 1 + self._LOOKAHEAD)):
                stmt = body[k]
                if not isinstance(stmt, cst.SimpleStatementLine):
                    break
                text = ctx.code(stmt)
                if re.search(r"\.backward\(|\.step\(|zero_grad\(", text):
                    break
                if _binds(ctx, stmt, "loss"):
                    end = k
                    break
        torch = ctx.torch_name()
        item = ctx.parse_expr(f'{torch}.autocast(device_type="{self.device_type}", dtype={torch}.{self.dtype})')

        def build(stmts: list[Any]) -> cst.With:
            lead = stmts[0].leading_lines
            inner = [stmts[0].with_changes(leading_lines=()), *stmts[1:]]
            return cst.With(
                items=[cst.WithItem(item=item)], body=cst.IndentedBlock(body=inner), leading_lines=lead
            )

        ctx.wrap_statements(fwd.stmt, body[end], build)
        last_line = ctx.span(body[end]).end.line
        lines = f"lines {ctx.line(fwd.stmt)}-{last_line}" if last_line != ctx.line(fwd.stmt) else f"line {fwd.line}"
        return (
            f"{ctx.filename}: {lines} now run under "
            f'{torch}.autocast(device_type="{self.device_type}", dtype={torch}.{self.dtype})'
        )


def _star_batch(fwd: _Forward) -> cst.Arg | None:
    for arg in fwd.call.args:
        if arg.star == "**":
            return arg
    return None


def _is_constant(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString, cst.Lambda)):
        return True
    return isinstance(expr, cst.Name) and expr.value in {"None", "True", "False"}


def _ends_with_call(expr: cst.BaseExpression, methods: Iterable[str]) -> bool:
    return (
        isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in set(methods)
    )


def _moves_device(ctx: _Ctx, expr: cst.BaseExpression) -> bool:
    """expr ends in `.cuda()` or a `.to(...)` that names a device, not only a dtype."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    method = expr.func.attr.value
    if method in ("cuda", "cpu"):
        return True
    if method != "to":
        return False
    return any(
        _arg_name(arg) in (None, "device") and not arg.star and dtype_of(arg.value, ctx.imports) is None
        for arg in expr.args
    )


def _edit_forward_args(ctx: _Ctx, fwd: _Forward, edits: Mapping[int, Callable[[cst.BaseExpression], Any]]) -> None:
    if not edits:
        return

    def edit(updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        for i, fn in edits.items():
            args[i] = args[i].with_changes(value=fn(args[i].value))
        return updated.with_changes(args=args)

    ctx.replace(fwd.call, edit)


class MoveBatchToDevice(_CSTCodemod):
    """Move the forward's inputs to the model's device right before the forward.

    ``model(**batch)`` gets ``batch = {k: v.to(device) for k, v in batch.items()}`` on the
    line before; keyword and positional arguments get ``.to(device)`` (constants and
    arguments that already end in ``.to(...)``/``.cuda()`` are left). The device is
    ``device_expr`` when given, else a ``device`` variable visible at the forward, else
    ``next(model.parameters()).device``: what every module has (a plain ``nn.Sequential``, or a
    model a wrapper holds, has no ``.device``).
    """

    DESCRIPTION = "Move the forward's inputs to the model's device right before the forward."

    def __init__(self, device_expr: str | None = None, *, variable: str | None = None, line: int | None = None):
        self.device_expr = device_expr
        self.variable = variable
        self.line = line

    def _edit(self, ctx: _Ctx) -> str:
        fwd = _select_forward(ctx, self.variable, self.line)
        if self.device_expr:
            ctx.parse_expr(self.device_expr)  # must be an expression
            device = self.device_expr
        elif ctx.scope_has(fwd.call, "device"):
            device = "device"
        else:
            device = f"next({fwd.model}.parameters()).device"
        star = _star_batch(fwd)
        changes = []
        if star is not None:
            if not isinstance(star.value, cst.Name):
                raise _Skip(
                    f"{ctx.filename}:{fwd.line}: the forward unpacks `{ctx.snippet(star.value)}`, not a variable; "
                    "cannot move it without restructuring the call"
                )
            name = star.value.value
            stmt = f"{name} = {{k: v.to({device}) for k, v in {name}.items()}}"
            block = ctx.parent(fwd.stmt)
            index = next(i for i, s in enumerate(block.body) if s is fwd.stmt)  # type: ignore[union-attr]
            if index > 0 and " ".join(ctx.code(block.body[index - 1]).split()) == stmt:  # type: ignore[union-attr]
                raise _Skip(f"{ctx.filename}:{fwd.line}: {name} is already moved to {device} on the line before")
            ctx.insert_before(fwd.stmt, [ctx.parse_stmt(stmt + "\n")])
            changes.append(f"`{stmt}` before line {ctx.line(fwd.stmt)}")
        edits = {}
        for i, arg in enumerate(fwd.call.args):
            if arg.star or _is_constant(arg.value) or _moves_device(ctx, arg.value):
                continue
            edits[i] = lambda v: _method_call(v, "to", [cst.Arg(ctx.parse_expr(device))])
            changes.append(f"{ctx.snippet(arg.value)}.to({device})")
        _edit_forward_args(ctx, fwd, edits)
        if not changes:
            raise _Skip(f"{ctx.filename}:{fwd.line}: no input of the forward left to move to a device")
        return f"{ctx.filename}:{fwd.line}: inputs moved to {device} — " + "; ".join(changes)


class CastBatch(_CSTCodemod):
    """Cast floating batch entries (``pixel_values``, ``input_values`` …) right before the forward.

    For ``model(**batch)``: ``batch["pixel_values"] = batch["pixel_values"].to(next(model.parameters()).dtype)``
    is inserted on the line before, one per key not passed as a keyword; a keyword (or a
    positional variable of that name) is wrapped: ``pixel_values=x.to(next(model.parameters()).dtype)``.
    The model's dtype is read off its first parameter, which every module has (``model.dtype`` is
    transformers' alone: a plain ``nn.Sequential`` has none).
    ``dtype=None`` casts to the model's own dtype; otherwise to ``torch.<dtype>``. ``positions``
    (key → index) names the positional arguments the forward binds to a key, for a call such as
    ``model(images)`` whose forward calls its first parameter ``pixel_values``.
    """

    DESCRIPTION = "Cast floating batch entries to the model's dtype right before the forward."

    def __init__(
        self,
        keys: Sequence[str] = ("pixel_values",),
        dtype: str | None = None,
        *,
        variable: str | None = None,
        line: int | None = None,
        positions: Mapping[str, int] | None = None,
    ):
        if isinstance(keys, str):
            keys = (keys,)
        if not keys or not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in keys):
            raise ValueError(f"keys must be identifiers, got {keys!r}")
        self.keys = tuple(keys)
        self.dtype = normalize_dtype(dtype) if dtype else None
        self.variable = variable
        self.line = line
        self.positions = dict(positions or {})

    def _edit(self, ctx: _Ctx) -> str:
        fwd = _select_forward(ctx, self.variable, self.line)
        target = f"{ctx.torch_name()}.{self.dtype}" if self.dtype else f"next({fwd.model}.parameters()).dtype"
        keyword = {_arg_name(a): i for i, a in enumerate(fwd.call.args) if a.keyword is not None}
        plain = [i for i, a in enumerate(fwd.call.args) if a.keyword is None and not a.star]
        positional = {
            a.value.value: i
            for i, a in enumerate(fwd.call.args)
            if a.keyword is None and not a.star and isinstance(a.value, cst.Name)
        }
        if not any(a.star == "*" for a in fwd.call.args):  # no *args: the indexes hold
            positional.update({k: plain[i] for k, i in self.positions.items() if i < len(plain) and k not in positional})
        changes, edits, inserts = [], {}, []
        star = _star_batch(fwd)
        for key in self.keys:
            index = keyword.get(key, positional.get(key))
            if index is not None:
                value = fwd.call.args[index].value
                if _ends_with_call(value, ("to",)) and ctx.code(value).endswith(f".to({target})"):
                    continue
                edits[index] = lambda v: _method_call(v, "to", [cst.Arg(ctx.parse_expr(target))])
                changes.append(f"{key}={ctx.snippet(value)}.to({target})")
            elif star is not None and isinstance(star.value, cst.Name):
                name = star.value.value
                stmt = f'{name}["{key}"] = {name}["{key}"].to({target})'
                inserts.append(ctx.parse_stmt(stmt + "\n"))
                changes.append(f"`{stmt}` before line {ctx.line(fwd.stmt)}")
        if not changes:
            keys = ", ".join(self.keys)
            raise _Skip(f"{ctx.filename}:{fwd.line}: the forward passes none of {keys} in a form that can be cast")
        if inserts:
            ctx.insert_before(fwd.stmt, inserts)
        _edit_forward_args(ctx, fwd, edits)
        return f"{ctx.filename}:{fwd.line}: batch cast to {target} — " + "; ".join(changes)


class LabelsToLong(_CSTCodemod):
    """Make labels int64: where they are built as int32, else right before the forward.

    First choice: rewrite the int32 cast where a labels tensor is built
    (``torch.tensor(y, dtype=torch.int32)`` → ``torch.int64``, as CastLabelsToLong does on
    the whole script). Otherwise: ``batch["labels"] = batch["labels"].long()`` before a
    ``model(**batch)`` forward, or ``labels=y.long()`` on a keyword.
    """

    DESCRIPTION = "Make labels int64 where they are built, else right before the forward."

    def __init__(self, *, key: str = "labels", variable: str | None = None, line: int | None = None):
        self.key = key
        self.variable = variable
        self.line = line

    def _edit(self, ctx: _Ctx) -> str:
        sites = _label_int_sites(ctx, ctx.module, None)
        if sites:
            changes = _rewrite_sites(ctx, sites, "int64")
            if changes:
                return f"{ctx.filename}: labels built as int64 — " + "; ".join(changes)
        fwd = _select_forward(ctx, self.variable, self.line)
        for i, arg in enumerate(fwd.call.args):
            if _arg_name(arg) == self.key:
                if _ends_with_call(arg.value, ("long",)):
                    raise _Skip(f"{ctx.filename}:{fwd.line}: {self.key} are already made int64 with .long()")
                _edit_forward_args(ctx, fwd, {i: lambda v: _method_call(v, "long")})
                return f"{ctx.filename}:{fwd.line}: {self.key}={ctx.snippet(arg.value)}.long()"
        star = _star_batch(fwd)
        if star is not None and isinstance(star.value, cst.Name):
            name = star.value.value
            stmt = f'{name}["{self.key}"] = {name}["{self.key}"].long()'
            ctx.insert_before(fwd.stmt, [ctx.parse_stmt(stmt + "\n")])
            return f"{ctx.filename}: `{stmt}` before the forward on line {fwd.line}"
        raise _Skip(f"{ctx.filename}: no int32 labels built and the forward on line {fwd.line} passes no {self.key}")


