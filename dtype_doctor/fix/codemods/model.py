"""Codemods that edit how a script loads and converts the model: SetLoadDtype, DropLoadDtype,
RemoveModelConversion, ReplaceModelConversion, KeepTrainableFloat32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from dtype_doctor.fix.codemods.base import DTYPE_METHODS, FLOATING, METHOD_DTYPES, _Skip, normalize_dtype
from dtype_doctor.fix.codemods.casts import dtype_of, _rewrite_sites, CastSite
from dtype_doctor.fix.codemods.context import (
    _append_arg,
    _arg_name,
    _CSTCodemod,
    _Ctx,
    _detached,
    dotted,
    _kwarg,
    _remove_arg,
)


# ---------------------------------------------------------------------------------------
# Pipeline script: the model load, its conversions, its forward

_NOT_MODELS = ("Tokenizer", "Processor", "FeatureExtractor", "Config", "Scheduler", "Peft")


@dataclass(frozen=True)
class _Load:
    call: cst.Call
    line: int
    cls: str | None
    targets: tuple[str, ...]
    strong: bool


def _chain_top(ctx: _Ctx, expr: cst.CSTNode) -> cst.CSTNode:
    """The outermost call of a method chain that starts with expr (`expr.to(d).eval()`)."""
    cur = expr
    while True:
        attr = ctx.parent(cur)
        call = ctx.parent(attr) if attr is not None else None
        if isinstance(attr, cst.Attribute) and attr.value is cur and isinstance(call, cst.Call) and call.func is attr:
            cur = call
        else:
            return cur


def _model_loads(ctx: _Ctx) -> tuple[list[_Load], list[str]]:
    """Model from_pretrained calls, and the class names of the non-model loads passed over."""
    loads, passed_over = [], []
    for node in ctx.nodes:
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            continue
        if node.func.attr.value != "from_pretrained":
            continue
        cls = dotted(node.func.value)
        last = cls.rsplit(".", 1)[-1] if cls else None
        if last and any(word in last for word in _NOT_MODELS):
            passed_over.append(last)
            continue
        top = _chain_top(ctx, node)
        holder = ctx.parent(top)
        targets: tuple[str, ...] = ()
        if isinstance(holder, cst.Assign) and holder.value is top:
            targets = tuple(ctx.code(t.target) for t in holder.targets)
        elif isinstance(holder, cst.AnnAssign) and holder.value is top:
            targets = (ctx.code(holder.target),)
        strong = bool(last and ("Model" in last or "For" in last or last.startswith("Auto"))) or any(
            "model" in t.lower() for t in targets
        )
        loads.append(_Load(node, ctx.line(node), cls, targets, strong))
    return loads, passed_over


def _select_loads(ctx: _Ctx, line: int | None) -> list[_Load]:
    """The model load; several only when they are alternatives bound to the same variable."""
    loads, passed_over = _model_loads(ctx)
    if line is not None:
        loads = [ld for ld in loads if ctx.covers(ld.call, line)]
    if not loads:
        where = f" on line {line}" if line is not None else ""
        also = f" (only {', '.join(sorted(set(passed_over)))} loads)" if passed_over and line is None else ""
        raise _Skip(f"no from_pretrained(...) call that loads a model found in {ctx.filename}{where}{also}")
    strong = [ld for ld in loads if ld.strong]
    pool = strong or loads
    same_target = pool[0].targets and all(ld.targets == pool[0].targets for ld in pool)
    if len(pool) > 1 and not same_target:
        lines = ", ".join(str(ld.line) for ld in pool)
        raise _Skip(
            f"ambiguous: {len(pool)} model from_pretrained(...) calls in {ctx.filename} (lines {lines}); pass line= to choose"
        )
    if not strong:
        for ld in pool:
            ctx.warn(f"took {ctx.snippet(ld.call.func)}(...) on line {ld.line} as the model load")
    return pool


def _model_names(ctx: _Ctx, variable: str | None, *, fallback: bool) -> tuple[set[str], set[int]]:
    """Names the model is bound to, and the ids of the model's from_pretrained calls."""
    loads, _ = _model_loads(ctx)
    chosen = [ld for ld in loads if ld.strong] or (loads if len(loads) == 1 else [])
    load_ids = {id(ld.call) for ld in chosen}
    if variable:
        return {variable}, load_ids
    names = {t for ld in chosen for t in ld.targets}
    if names or not fallback:
        return names, load_ids
    ctx.warn(f"no from_pretrained(...) call binds the model in {ctx.filename}; took `model` as the model")
    return {"model"}, load_ids


class SetLoadDtype(_CSTCodemod):
    """Add or change the ``dtype=`` keyword of the model's ``from_pretrained(...)`` call.

    The model load is the one ``from_pretrained`` call on a model class (``AutoModel*``,
    ``*For*``, ``*Model``) or bound to a ``*model*`` variable; tokenizer, processor, feature
    extractor, config, scheduler and PEFT loads are never touched. A legacy
    ``torch_dtype=`` keyword is rewritten to ``dtype=``. ``to_dtype="auto"`` writes
    ``dtype="auto"``. Several model loads are ambiguous unless ``line`` picks one, or
    they are alternatives bound to the same variable (``if ...: model = A.from_pretrained``
    ``else: model = B.from_pretrained``), which are all changed.
    """

    DESCRIPTION = "Add or change the dtype= keyword of the model's from_pretrained(...) call."

    def __init__(self, to_dtype: str, *, line: int | None = None):
        self.to_dtype = "auto" if to_dtype == "auto" else normalize_dtype(to_dtype)
        self.line = line

    def _value_is_target(self, ctx: _Ctx, value: cst.BaseExpression) -> bool:
        if self.to_dtype == "auto":
            return isinstance(value, cst.SimpleString) and value.evaluated_value == "auto"
        found = dtype_of(value, ctx.imports)
        return found is not None and found[1] == self.to_dtype

    def _edit(self, ctx: _Ctx) -> str:
        loads = _select_loads(ctx, self.line)
        done = [self._edit_load(ctx, load) for load in loads]
        changed = [d for d in done if d is not None]
        if not changed:
            reasons = "; ".join(self._already(ctx, load) for load in loads)
            raise _Skip(reasons)
        return "; ".join(changed)

    def _already(self, ctx: _Ctx, load: _Load) -> str:
        for arg in load.call.args:
            if _arg_name(arg) in ("dtype", "torch_dtype"):
                return f"{ctx.filename}:{load.line}: the model already loads with {_arg_name(arg)}={ctx.code(arg.value)}"
        return f"{ctx.filename}:{load.line}: nothing to change"  # pragma: no cover - _edit_load changes it then

    def _edit_load(self, ctx: _Ctx, load: _Load) -> str | None:
        call = load.call
        where = f"{ctx.filename}:{load.line}"
        dtype_i = [i for i, a in enumerate(call.args) if _arg_name(a) == "dtype"]
        legacy_i = [i for i, a in enumerate(call.args) if _arg_name(a) == "torch_dtype"]
        if dtype_i and self._value_is_target(ctx, call.args[dtype_i[0]].value) and not legacy_i:
            return None
        if not dtype_i and legacy_i and self._value_is_target(ctx, call.args[legacy_i[0]].value):
            return None
        if any(a.star == "**" for a in call.args):
            ctx.warn(f"{where}: the call also passes **kwargs; if they carry dtype/torch_dtype the call will fail")

        value: cst.BaseExpression
        if self.to_dtype == "auto":
            value = cst.SimpleString('"auto"')
        else:
            value = cst.Attribute(value=cst.Name(ctx.torch_name()), attr=cst.Name(self.to_dtype))
        rendered = cst.Module(body=()).code_for_node(value)

        def edit(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            if dtype_i:
                args[dtype_i[0]] = args[dtype_i[0]].with_changes(value=value)
                out = updated.with_changes(args=args)
                for i in sorted(legacy_i, reverse=True):
                    out = _remove_arg(out, i)
                return out
            if legacy_i:
                args[legacy_i[0]] = args[legacy_i[0]].with_changes(keyword=cst.Name("dtype"), value=value)
                return updated.with_changes(args=args)
            return _append_arg(updated, _kwarg("dtype", value))

        ctx.replace(call, edit)
        model = ctx.snippet(call.func)
        if dtype_i:
            old = ctx.code(call.args[dtype_i[0]].value)
            return f"{where}: {model}(...) now loads with dtype={rendered} (was dtype={old})"
        if legacy_i:
            old = ctx.code(call.args[legacy_i[0]].value)
            ctx.warn(f"{where}: rewrote the legacy torch_dtype= keyword to dtype=")
            return f"{where}: {model}(...) now loads with dtype={rendered} (was torch_dtype={old})"
        return f"{where}: {model}(...) now loads with dtype={rendered}"


@dataclass(frozen=True)
class _Conversion:
    link: cst.Call  # the call in the chain that converts
    dtype: str  # "" for a `dtype=` name the source does not resolve, at a line the run saw convert the model
    dtype_arg: int | None  # index of the dtype argument of .to(...)/.type(...); None for .half() & co
    keeps_call: bool  # .to(device, dtype=...): only the dtype argument goes


def _unchain(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, list[cst.Call]]:
    """`model.to(d).half()` → (model, [to(d) call, half() call]), innermost first."""
    links = []
    cur = expr
    while isinstance(cur, cst.Call) and isinstance(cur.func, cst.Attribute):
        links.append(cur)
        cur = cur.func.value
    links.reverse()
    return cur, links


def _conversion(ctx: _Ctx, link: cst.Call, seen: bool = False) -> _Conversion | None:
    """The dtype conversion `link` makes. `seen`: the run saw this line convert the model, so a
    `dtype=weight_dtype` it cannot resolve from the source is the conversion it saw."""
    attr = link.func.attr.value  # type: ignore[union-attr]
    if attr in METHOD_DTYPES and attr in ("half", "float", "double", "bfloat16") and not link.args:
        return _Conversion(link, METHOD_DTYPES[attr], None, False)
    if attr in ("to", "type"):
        for i, arg in enumerate(link.args):
            if arg.keyword is None or arg.keyword.value == "dtype":
                found = dtype_of(arg.value, ctx.imports)
                if found and found[0] == "torch" and found[1] in FLOATING:
                    return _Conversion(link, found[1], i, len(link.args) > 1)
                if seen and not found and arg.keyword is not None:
                    return _Conversion(link, "", i, len(link.args) > 1)
    return None


@dataclass(frozen=True)
class _ChainStatement:
    small: cst.BaseSmallStatement
    line_stmt: cst.SimpleStatementLine
    value: cst.BaseExpression
    root: cst.BaseExpression  # model variable or the from_pretrained call
    links: list[cst.Call]  # after the root
    conversions: list[_Conversion]


def _model_conversions(ctx: _Ctx, variable: str | None, lines: frozenset[int] | None = None) -> list[_ChainStatement]:
    """The statements that convert the model: on its variables (those from_pretrained binds, or
    `variable`), or, given `lines` (where a run saw the model converted), whatever those lines convert."""
    names, load_ids = _model_names(ctx, variable, fallback=False)
    if not names and not load_ids and lines is None:
        raise _Skip(f"no from_pretrained(...) call found in {ctx.filename}")
    found = []
    for node in ctx.nodes:
        if not isinstance(node, cst.SimpleStatementLine):
            continue
        if lines is not None and not any(ctx.covers(node, n) for n in lines):
            continue
        for small in node.body:
            value = getattr(small, "value", None)
            if not isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign, cst.Return)) or value is None:
                continue
            base, links = _unchain(value)
            start = None
            for k, link in enumerate(links):
                if id(link) in load_ids:
                    start = k + 1
            if start is not None:
                root, rest = links[start - 1], links[start:]
            elif ctx.code(base) in names or (lines is not None and isinstance(base, (cst.Name, cst.Attribute))):
                root, rest = base, links
            else:
                continue
            conversions = [c for c in (_conversion(ctx, link, seen=lines is not None) for link in rest) if c]
            if conversions:
                found.append(_ChainStatement(small, node, value, root, rest, conversions))
    return found


def _rebuild_chain(root: cst.BaseExpression, links: Sequence[cst.Call], top: cst.BaseExpression) -> cst.BaseExpression:
    new: cst.BaseExpression = root
    for link in links:
        new = link.with_changes(func=link.func.with_changes(value=new))
    if new is not top and top.lpar:  # the chain's own parentheses may hold its line breaks
        new = new.with_changes(lpar=top.lpar, rpar=top.rpar)
    return new


class _ModelConversionCodemod(_CSTCodemod):
    def __init__(self, *, from_dtype: str | None = None, variable: str | None = None, lines: Iterable[int] | None = None):
        self.from_dtype = normalize_dtype(from_dtype) if from_dtype else None
        self.variable = variable
        self.lines = frozenset(lines) if lines is not None else None  # where a run saw the conversion

    def _wanted(self, conv: _Conversion, to: str) -> bool:
        if not conv.dtype:  # unresolved by name, at a line the run saw make the dtype it reports
            return True
        return conv.dtype == self.from_dtype if self.from_dtype else conv.dtype != to


class RemoveModelConversion(_ModelConversionCodemod):
    """Remove the dtype conversion applied to the loaded model, keeping a device move.

    Handles statements on the variable bound from ``from_pretrained`` (or ``variable``)
    and chains on the load itself: ``model.half()`` and ``model = model.half()`` go;
    ``model.to(device, dtype=torch.float16)`` → ``model.to(device)``;
    ``model = model.to(device).half()`` → ``model = model.to(device)``;
    ``AutoModel.from_pretrained(x).half()`` → ``AutoModel.from_pretrained(x)``. By default
    conversions to any floating dtype but float32 are removed; ``from_dtype`` selects one.
    A block left empty gets ``pass``; comment lines right above a removed line go with it
    (with a warning), comments further up stay.
    """

    DESCRIPTION = "Remove the .half()/.to(dtype) conversion applied to the loaded model, keeping any device move."

    def _edit(self, ctx: _Ctx) -> str:
        statements = _model_conversions(ctx, self.variable, self.lines)
        changes = []
        removed: dict[int, tuple[cst.SimpleStatementLine, list[cst.BaseSmallStatement]]] = {}
        for st in statements:
            drop = [c for c in st.conversions if self._wanted(c, "float32")]
            if not drop:
                continue
            drop_ids = {id(c.link): c for c in drop}
            kept: list[cst.Call] = []
            for link in st.links:
                conv = drop_ids.get(id(link))
                if conv is None:
                    kept.append(link)
                elif conv.keeps_call:
                    assert conv.dtype_arg is not None
                    kept.append(_remove_arg(link, conv.dtype_arg))
            new_value = _rebuild_chain(st.root, kept, st.value)
            line = ctx.line(st.small)
            before = ctx.snippet(st.small).rstrip(";").rstrip()
            targets = (
                [t.target for t in st.small.targets]
                if isinstance(st.small, cst.Assign)
                else [st.small.target]
                if isinstance(st.small, cst.AnnAssign)
                else []
            )
            removes_statement = not kept and (
                isinstance(st.small, cst.Expr)
                or (targets and all(ctx.code(t) == ctx.code(st.root) for t in targets))
            )
            if removes_statement:
                removed.setdefault(id(st.line_stmt), (st.line_stmt, []))[1].append(st.small)
                changes.append(f"line {line}: removed `{before}`")
            else:
                ctx.replace(st.value, new_value)
                after = " ".join(cst.Module(body=()).code_for_node(st.small.with_changes(value=new_value)).split())
                changes.append(f"line {line}: `{before}` → `{after}`")
        for line, smalls in removed.values():
            self._remove(ctx, line, smalls)
        if not changes:
            which = self.from_dtype or "half/float64"
            raise _Skip(f"no {which} conversion of the model found in {ctx.filename}")
        return f"{ctx.filename}: model conversion removed — " + "; ".join(changes)

    @staticmethod
    def _remove(ctx: _Ctx, line: cst.SimpleStatementLine, smalls: list[cst.BaseSmallStatement]) -> None:
        if len(smalls) == len(line.body):
            attached = line.leading_lines[len(_detached(line.leading_lines)) :]
            if attached:
                comments = " / ".join(x.comment.value for x in attached if x.comment)
                ctx.warn(f"{ctx.filename}:{ctx.line(line)}: removed the comment above the removed line too: {comments}")
            ctx.remove_statement(line)
            return
        gone = {i for i, s in enumerate(line.body) if any(s is x for x in smalls)}

        def edit(updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
            body = [s for i, s in enumerate(updated.body) if i not in gone]
            if (len(line.body) - 1) in gone:  # the last one went: its predecessor ends the line now
                body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(body=body)

        ctx.replace(line, edit)


class ReplaceModelConversion(_ModelConversionCodemod):
    """Change the dtype of the conversion applied to the loaded model, keeping its style.

    ``model.half()`` → ``model.bfloat16()`` / ``model.float()``;
    ``model.to(torch.float16)`` → ``model.to(torch.bfloat16)``; ``dtype=`` keywords alike.
    Same statements as RemoveModelConversion; ``from_dtype`` restricts which conversions.
    """

    DESCRIPTION = "Change the dtype of the .half()/.to(dtype) conversion applied to the loaded model."

    def __init__(self, to_dtype: str, *, from_dtype: str | None = None, variable: str | None = None, lines: Iterable[int] | None = None):
        super().__init__(from_dtype=from_dtype, variable=variable, lines=lines)
        self.to_dtype = normalize_dtype(to_dtype)
        if self.to_dtype not in FLOATING:
            raise ValueError(f"ReplaceModelConversion converts to a floating dtype, not {to_dtype!r}")

    def _edit(self, ctx: _Ctx) -> str:
        statements = _model_conversions(ctx, self.variable, self.lines)
        changes = []
        for st in statements:
            for conv in st.conversions:
                if not conv.dtype or not self._wanted(conv, self.to_dtype):
                    continue  # a dtype held by a name is the script's choice by mode: not rewritten to a literal
                line = ctx.line(conv.link)
                if conv.dtype_arg is None:
                    attr = conv.link.func.attr  # type: ignore[union-attr]
                    ctx.replace(attr, cst.Name(DTYPE_METHODS[self.to_dtype]))
                    changes.append(f"line {line}: .{attr.value}() → .{DTYPE_METHODS[self.to_dtype]}()")
                else:
                    expr = conv.link.args[conv.dtype_arg].value
                    site = CastSite(expr, "expr", "torch", conv.dtype, line)
                    changes += _rewrite_sites(ctx, [site], self.to_dtype)
        if not changes:
            raise _Skip(f"no conversion of the model to another dtype than {self.to_dtype} found in {ctx.filename}")
        return f"{ctx.filename}: model conversion now to {self.to_dtype} — " + "; ".join(changes)




class DropLoadDtype(_CSTCodemod):
    """Drop a half ``dtype=`` (or legacy ``torch_dtype=``) from the model's ``from_pretrained(...)``:
    the weights load as the checkpoint's config says (float32 for a model trained in it), which is
    what fp16 mixed precision (a GradScaler) needs of its trainable weights. A dtype given through a
    variable is left: what it holds is not known here."""

    DESCRIPTION = "Drop the half dtype= of the model's from_pretrained(...) call."

    def __init__(self, *, line: int | None = None):
        self.line = line

    def _edit(self, ctx: _Ctx) -> str:
        done = []
        for load in _select_loads(ctx, self.line):
            for i, arg in enumerate(load.call.args):
                if _arg_name(arg) not in ("dtype", "torch_dtype"):
                    continue
                found = dtype_of(arg.value, ctx.imports)
                if found is None or found[1] not in ("float16", "bfloat16"):
                    raise _Skip(f"{ctx.filename}:{load.line}: the model loads with {_arg_name(arg)}={ctx.code(arg.value)}, not a half dtype written out")
                ctx.replace(load.call, lambda updated, i=i: _remove_arg(updated, i))
                done.append(f"{ctx.filename}:{load.line}: {ctx.snippet(load.call.func)}(...) no longer loads with {_arg_name(arg)}={ctx.code(arg.value)}")
        if not done:
            raise _Skip(f"the model's from_pretrained(...) in {ctx.filename} passes no dtype=")
        return "; ".join(done)


class KeepTrainableFloat32(_CSTCodemod):
    """After the line that made the model half (``model.half()``, a half ``from_pretrained``), put its
    trainable parameters back in float32: the master weights fp16 mixed precision needs, the frozen
    ones left as they are."""

    DESCRIPTION = "Keep the model's trainable parameters float32 after the line that made it half."

    def __init__(self, line: int | None = None):
        self.line = line  # None: the line of the model's from_pretrained(...)

    def _edit(self, ctx: _Ctx) -> str:
        line = self.line if self.line is not None else _select_loads(ctx, None)[-1].line
        stmts = [n for n in ctx.nodes if isinstance(n, cst.SimpleStatementLine) and ctx.covers(n, line)]
        if not stmts:
            raise _Skip(f"{ctx.filename}:{line}: the model is not made half by a statement of its own there")
        stmt = stmts[-1]
        small = stmt.body[-1]
        if isinstance(small, (cst.Assign, cst.AnnAssign)):
            target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
        elif isinstance(small, cst.Expr):
            target, _ = _unchain(small.value)
        else:
            raise _Skip(f"{ctx.filename}:{line}: `{ctx.snippet(small)}` binds no model to keep float32")
        if not isinstance(target, (cst.Name, cst.Attribute)):
            raise _Skip(f"{ctx.filename}:{line}: `{ctx.snippet(small)}` binds no model to keep float32")
        model = ctx.code(target)
        loop = ctx.parse_stmt(
            f"for param in {model}.parameters():  # trainable weights stay float32 for fp16 mixed precision\n"
            "    if param.requires_grad:\n"
            "        param.data = param.data.float()\n"
        )
        ctx.insert_after(stmt, [loop])
        return f"{ctx.filename}:{line}: the trainable parameters of {model} kept float32 after `{ctx.snippet(small)}`"


class RegisterBuffer(_CSTCodemod):
    """A tensor a module keeps as a plain attribute (`self.freqs_cos = ...`), which `model.to()` leaves
    where it was made, registered as a non-persistent buffer on the line that assigns it, so it moves
    with the model and the state_dict stays as it was: ``self.freqs = t`` →
    ``self.register_buffer("freqs", t, persistent=False)``; in a tuple assignment the attribute becomes
    a local first (``freqs_cos, self.freqs_sin = ...`` then the register_buffer line)."""

    DESCRIPTION = "Register a tensor attribute as a buffer where __init__ assigns it, so model.to() moves it."

    def __init__(self, line: int, attr: str):
        self.line = line
        self.attr = attr

    def _is_attr(self, node: cst.BaseExpression) -> bool:
        return dotted(node) == f"self.{self.attr}"

    def _edit(self, ctx: _Ctx) -> str:
        found = [(stmt, n) for stmt in ctx.nodes if isinstance(stmt, cst.SimpleStatementLine) and ctx.line(stmt) == self.line
                 for n in stmt.body if isinstance(n, cst.Assign) and len(n.targets) == 1]
        register = f'self.register_buffer("{self.attr}", {{}}, persistent=False)'
        for stmt, assign in found:
            target = assign.targets[0].target
            if self._is_attr(target):
                call = ctx.parse_expr(register.format(ctx.module.code_for_node(assign.value)))
                ctx.replace(assign, lambda _u, call=call: cst.Expr(call))
                return f"{ctx.filename}:{self.line}: self.{self.attr} registered as a buffer"
            if isinstance(target, cst.Tuple) and any(self._is_attr(e.value) for e in target.elements):
                ctx.replace(assign, lambda updated: updated.with_changes(targets=[updated.targets[0].with_changes(target=updated.targets[0].target.with_changes(
                    elements=[e.with_changes(value=cst.Name(self.attr)) if self._is_attr(e.value) else e for e in updated.targets[0].target.elements]))]))
                ctx.insert_after(stmt, [ctx.parse_stmt(register.format(self.attr))])
                return f"{ctx.filename}:{self.line}: self.{self.attr} registered as a buffer"
        raise _Skip(f"{ctx.filename}:{self.line}: no assignment of self.{self.attr} on that line")
