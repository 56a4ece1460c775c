"""Codemods that edit the dtype casts in the user's own function (``--preprocess FILE.py:FUNC``,
or a script's label building): RetargetCast, CastLabelsToLong, and CastReturnedValue for
when the function casts nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from dtype_doctor.fix.codemods.base import (
    _CAST_METHODS,
    _DTYPE_METHODS,
    _family,
    _INTEGER,
    _METHOD_DTYPES,
    _NUMPY_DTYPES,
    _Skip,
    _STRING_DTYPES,
    _TORCH_DTYPES,
    normalize_dtype,
)
from dtype_doctor.fix.codemods.context import _CSTCodemod, _Ctx, _dotted, _Imports, _walk


# ---------------------------------------------------------------------------------------
# Finding casts


@dataclass(frozen=True)
class _Site:
    """One place that sets a dtype: a dtype expression, or the name of a casting method."""

    node: cst.CSTNode  # what gets replaced: the dtype expression, or the method's Name
    kind: str  # "expr" | "method"
    lib: str  # torch | numpy | str | method
    dtype: str
    line: int


def _dtype_of(expr: cst.CSTNode, imports: _Imports) -> tuple[str, str] | None:
    """(library, canonical dtype) when expr names a dtype: torch.float16, np.int32, "float16"."""
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        base, attr = expr.value.value, expr.attr.value
        if base in imports.torch and attr in _TORCH_DTYPES:
            return "torch", _TORCH_DTYPES[attr]
        if base in imports.numpy and attr in _NUMPY_DTYPES:
            return "numpy", _NUMPY_DTYPES[attr]
        return None
    if isinstance(expr, cst.Name):
        return imports.names.get(expr.value)
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        if isinstance(value, str) and value in _STRING_DTYPES:
            return "str", value
    return None


def _cast_sites(ctx: _Ctx, scope: cst.CSTNode) -> list[_Site]:
    sites: dict[int, _Site] = {}
    imports = ctx.imports

    def add(node: cst.CSTNode, kind: str, lib: str, dtype: str) -> None:
        sites.setdefault(id(node), _Site(node, kind, lib, dtype, ctx.line(node)))

    for node in _walk(scope):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            module_ref = isinstance(func.value, cst.Name) and func.value.value in (imports.torch | imports.numpy)
            if attr in _METHOD_DTYPES and not node.args and not module_ref:
                add(func.attr, "method", "method", _METHOD_DTYPES[attr])
            if attr in _CAST_METHODS and not module_ref:
                for arg in node.args:
                    if arg.keyword is None or arg.keyword.value == "dtype":
                        found = _dtype_of(arg.value, imports)
                        if found:
                            add(arg.value, "expr", *found)
        numpy_call = isinstance(func, cst.Attribute) and _dotted(func.value) in imports.numpy
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "dtype":
                found = _dtype_of(arg.value, imports)
                if found:
                    add(arg.value, "expr", *found)
            elif arg.keyword is None and not arg.star and numpy_call:  # np.asarray(x, np.int32)
                found = _dtype_of(arg.value, imports)
                if found and found[0] in ("numpy", "str"):
                    add(arg.value, "expr", *found)
        found = _dtype_of(func, imports)
        if found and found[0] == "numpy":  # np.float16(x)
            add(func, "expr", *found)
    return sorted(sites.values(), key=lambda s: (s.line, ctx.span(s.node).start.column))


def _retarget(ctx: _Ctx, site: _Site, to: str) -> cst.CSTNode | None:
    """The node that replaces site.node to cast to `to` in the same style; None when impossible."""
    node = site.node
    if site.kind == "method":
        return cst.Name(_DTYPE_METHODS[to]) if to in _DTYPE_METHODS else None
    if site.lib in ("str", "numpy") and to not in _NUMPY_DTYPES.values():
        return None  # numpy has no bfloat16
    if site.lib == "str":
        assert isinstance(node, cst.SimpleString)
        return cst.SimpleString(f"{node.prefix}{node.quote}{to}{node.quote}")
    if isinstance(node, cst.Attribute):
        return node.with_changes(attr=cst.Name(to))
    if isinstance(node, cst.Name):  # from torch import float16 → torch.float32
        if site.lib == "torch":
            return cst.Attribute(value=cst.Name(ctx.torch_name()), attr=cst.Name(to))
        for name in sorted(ctx.imports.numpy):  # from numpy import float16 → np.float32
            if ctx.scope_has(node, name):
                return cst.Attribute(value=cst.Name(name), attr=cst.Name(to))
    return None


def _describe(ctx: _Ctx, site: _Site) -> str:
    if site.kind == "method":
        return f".{ctx.code(site.node)}()"
    return ctx.code(site.node)


def _rewrite_sites(ctx: _Ctx, sites: Sequence[_Site], to: str) -> list[str]:
    changes = []
    for site in sites:
        new = _retarget(ctx, site, to)
        if new is None:
            ctx.warn(f"{ctx.filename}:{site.line}: cannot express {to} in the style of {_describe(ctx, site)}; left as is")
            continue
        ctx.replace(site.node, new)
        after = f".{new.value}()" if site.kind == "method" else cst.Module(body=()).code_for_node(new)
        changes.append(f"line {site.line}: {_describe(ctx, site)} → {after}")
    return changes


# ---------------------------------------------------------------------------------------
# Preprocessing file codemods


class RetargetCast(_CSTCodemod):
    """Rewrite the cast that sets the offending dtype inside a preprocessing function.

    Recognised casts: ``.to(torch.float16)``, ``.to(x, dtype=...)``, ``.half()`` /
    ``.float()`` / ``.double()`` / ``.bfloat16()``, ``.type(torch.float16)``, a ``dtype=``
    keyword of any call (``torch.tensor(..., dtype=torch.float64)``, ``np.array``),
    ``.astype(np.float16)`` / ``.astype("float16")`` and ``np.float16(x)``. Each keeps its
    style (``.half()`` → ``.float()``, ``np.float16`` → ``np.float32``).

    ``key`` keeps only the casts that build the function's output of that name (``out["k"] =
    …``, ``{"k": …}``, ``dict(k=…)`` and the local names they use); ``lines`` only those on the
    lineage's source lines. Located that way, a cast in any family is rewritten (float input_ids
    made with ``.astype(np.float32)`` become ``.astype(np.int64)``); otherwise only casts in
    the family of ``to_dtype`` are candidates. ``from_dtype`` narrows further. All candidates
    are rewritten when they agree on one source dtype; casts to different dtypes with no
    filter given are ambiguous and skipped.
    """

    DESCRIPTION = "Rewrite the dtype cast inside a preprocessing function to the dtype the model expects."

    def __init__(
        self,
        function: str,
        to_dtype: str,
        *,
        from_dtype: str | None = None,
        lines: Iterable[int] | None = None,
        key: str | None = None,
    ):
        self.function = function
        self.to_dtype = normalize_dtype(to_dtype)
        self.from_dtype = normalize_dtype(from_dtype) if from_dtype else None
        self.lines = frozenset(lines) if lines is not None else None
        self.key = key

    def _edit(self, ctx: _Ctx) -> str:
        fn = ctx.function(self.function)
        where = f"{ctx.filename}:{self.function}" + (f" ({self.key})" if self.key else "")
        family = _family(self.to_dtype)
        if self.key is None:
            sites = [s for s in _cast_sites(ctx, fn) if self.lines is not None or _family(s.dtype) == family]
        else:
            found = {id(s.node): s for v in _values_for(fn, lambda name: name == self.key) for s in _cast_sites(ctx, v)}
            sites = sorted(found.values(), key=lambda s: (s.line, ctx.span(s.node).start.column))
        if self.lines is not None:
            sites = [s for s in sites if ctx.on_lines(s.node, self.lines)]
        if self.from_dtype:
            sites = [s for s in sites if s.dtype == self.from_dtype]
        todo = [s for s in sites if s.dtype != self.to_dtype]
        on_lines = f" on line {', '.join(map(str, sorted(self.lines)))}" if self.lines else ""
        if not todo:
            if sites:
                raise _Skip(f"the casts in {where}{on_lines} already cast to {self.to_dtype}")
            what = f"{self.from_dtype} cast" if self.from_dtype else "cast" if self.key or self.lines else f"{family} cast"
            raise _Skip(f"no {what} found in {where}{on_lines}")
        dtypes = sorted({s.dtype for s in todo})
        if len(dtypes) > 1 and self.from_dtype is None and self.lines is None:
            listed = "; ".join(f"{d} (line {', '.join(str(s.line) for s in todo if s.dtype == d)})" for d in dtypes)
            raise _Skip(f"ambiguous: casts to {listed} in {where}; pass from_dtype or lines to choose")
        changes = _rewrite_sites(ctx, todo, self.to_dtype)
        if not changes:
            raise _Skip(f"no cast in {where} can be rewritten to {self.to_dtype}")
        return f"{where}: cast to {self.to_dtype} — " + "; ".join(changes)


def _is_label_name(name: str) -> bool:
    return (name in {"label", "labels", "label_ids"} or name.endswith(("_label", "_labels"))) and not name.startswith(
        "num_"
    )


def _key_target(target: cst.BaseExpression, is_key: Callable[[str], bool]) -> bool:
    if isinstance(target, cst.Name):
        return is_key(target.value)
    if isinstance(target, cst.Attribute):
        return is_key(target.attr.value)
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
            return isinstance(key, str) and is_key(key)
    return False


def _label_values(scope: cst.CSTNode) -> list[cst.BaseExpression]:
    """Expressions whose value ends up as labels: `labels = …`, `{"labels": …}`, `labels=…`."""
    return _values_for(scope, _is_label_name)


def _values_for(scope: cst.CSTNode, is_key: Callable[[str], bool]) -> list[cst.BaseExpression]:
    """Expressions whose value ends up under a key `is_key` accepts: `k = …`, `out["k"] = …`,
    `{"k": …}`, `k=…`, and the assignments of the local names those use."""
    nodes = _walk(scope)
    values: list[cst.BaseExpression] = []
    for node in nodes:
        if isinstance(node, cst.Assign) and any(_key_target(t.target, is_key) for t in node.targets):
            values.append(node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None and _key_target(node.target, is_key):
            values.append(node.value)
        elif isinstance(node, cst.Dict):
            for el in node.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                    key = el.key.evaluated_value
                    if isinstance(key, str) and is_key(key):
                        values.append(el.value)
        elif isinstance(node, cst.Arg) and node.keyword is not None and is_key(node.keyword.value):
            values.append(node.value)
    # `y = np.array(..., dtype=np.int32); return {"labels": y}`: follow names to their assignments,
    # and a list built with `y.append(…)` to what is appended.
    seen: set[str] = set()
    for _ in range(3):
        names = {v.value for v in values if isinstance(v, cst.Name)} - seen
        if not names:
            break
        seen |= names
        for node in nodes:
            if isinstance(node, cst.Assign) and any(
                isinstance(t.target, cst.Name) and t.target.value in names for t in node.targets
            ):
                values.append(node.value)
            elif (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in ("append", "extend", "insert")
                and isinstance(node.func.value, cst.Name)
                and node.func.value.value in names
            ):
                values += [a.value for a in node.args]
    return values


def _label_int_sites(ctx: _Ctx, scope: cst.CSTNode, lines: frozenset[int] | None) -> list[_Site]:
    sites: dict[int, _Site] = {}
    for value in _label_values(scope):
        for site in _cast_sites(ctx, value):
            if site.dtype in _INTEGER and site.dtype != "int64" and (lines is None or ctx.on_lines(site.node, lines)):
                sites[id(site.node)] = site
    return sorted(sites.values(), key=lambda s: (s.line, ctx.span(s.node).start.column))


class CastLabelsToLong(_CSTCodemod):
    """Labels built as int32 (or narrower) inside a function → int64.

    Looks at values assigned to / returned under a label name (``label``, ``labels``,
    ``label_ids``, ``*_labels``) — ``labels = …``, ``out["labels"] = …``, ``{"labels": …}``,
    ``dict(labels=…)``, and the variable such a value names — and rewrites their integer
    casts: ``dtype=torch.int32`` → ``torch.int64``, ``.int()`` → ``.long()``,
    ``.astype(np.int32)`` → ``.astype(np.int64)``. ``function=None`` searches the whole file.
    """

    DESCRIPTION = "Build label tensors as int64 instead of int32 inside a preprocessing function."

    def __init__(self, function: str | None = None, *, lines: Iterable[int] | None = None):
        self.function = function
        self.lines = frozenset(lines) if lines is not None else None

    def _edit(self, ctx: _Ctx) -> str:
        scope = ctx.function(self.function) if self.function else ctx.module
        where = f"{ctx.filename}:{self.function}" if self.function else ctx.filename
        sites = _label_int_sites(ctx, scope, self.lines)
        if not sites:
            raise _Skip(f"no int32 cast on labels found in {where}")
        changes = _rewrite_sites(ctx, sites, "int64")
        if not changes:
            raise _Skip(f"no labels cast in {where} can be rewritten to int64")
        return f"{where}: labels built as int64 — " + "; ".join(changes)




# ---------------------------------------------------------------------------------------
# Casting where the function returns the value


def _own_returns(ctx: _Ctx, fn: cst.CSTNode) -> list[cst.Return]:
    """The return statements of `fn` itself, not of functions nested in it."""
    out = []
    for node in _walk(fn):
        if isinstance(node, cst.Return) and node.value is not None:
            owner = next((a for a in ctx.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
            if owner is fn:
                out.append(node)
    return out


def _is_batched(fn: cst.FunctionDef) -> bool:
    """Whether the loader maps `fn` with batched=True (the name of its first parameter says so)."""
    from dtype_doctor.load.batch.preprocess import BATCHED_PARAM_NAMES

    params = fn.params.posonly_params or fn.params.params
    return bool(params) and params[0].name.value in BATCHED_PARAM_NAMES


def _key_of(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


class CastReturnedValue(_CSTCodemod):
    """Cast one output of a function where the function returns it.

    For when no cast in the function sets the dtype (ids built by numpy arithmetic, a list of
    Python floats): ``return {"input_ids": ids}`` → ``{"input_ids": torch.as_tensor(ids,
    dtype=torch.int64)}``; ``return out`` → ``out["input_ids"] = …`` on the line before;
    any other returned mapping is bound to a name first. Written with torch when the file
    imports it (or numpy's ``np.asarray`` when it imports only numpy), so lists, arrays and
    tensors are all cast.
    """

    DESCRIPTION = "Cast one output of the user's function to the dtype the model needs, where the function returns it."

    def __init__(self, function: str, key: str, dtype: str):
        self.function = function
        self.key = key
        self.to_dtype = normalize_dtype(dtype)

    def _cast(self, ctx: _Ctx, at: cst.CSTNode, value: str, batched: bool) -> str:
        numpy = next((n for n in sorted(ctx.imports.numpy) if ctx.scope_has(at, n)), None)
        if numpy and not ctx.imports.top_level_torch and self.to_dtype in _NUMPY_DTYPES.values():
            cast = f"{numpy}.asarray({{}}, dtype={numpy}.{self.to_dtype})"
        else:
            torch = ctx.torch_name()
            cast = f"{torch}.as_tensor({{}}, dtype={torch}.{self.to_dtype})"
        # A batched function returns one value per row (often a list of arrays or tensors).
        return f"[{cast.format('row')} for row in {value}]" if batched else cast.format(value)

    def _edit(self, ctx: _Ctx) -> str:
        fn = ctx.function(self.function)
        where = f"{ctx.filename}:{self.function}"
        if isinstance(fn, cst.Lambda):
            raise _Skip(f"{where} is a lambda; no statement to cast its output in")
        returns = _own_returns(ctx, fn)
        if not returns:
            raise _Skip(f"{where} returns nothing to cast")
        batched = _is_batched(fn)
        key = repr(self.key).replace("'", '"')
        done = []
        for ret in returns:
            value = ret.value
            assert value is not None
            line = ctx.line(ret)
            if isinstance(value, cst.Dict):
                el = next((e for e in value.elements if isinstance(e, cst.DictElement) and _key_of(e.key) == self.key), None)
                if el is not None:
                    ctx.replace(el.value, ctx.parse_expr(self._cast(ctx, ret, ctx.code(el.value), batched)))
                    done.append(f"line {line}")
                    continue
            if isinstance(value, cst.Call) and _dotted(value.func) == "dict":
                arg = next((a for a in value.args if a.keyword is not None and a.keyword.value == self.key), None)
                if arg is not None:
                    ctx.replace(arg.value, ctx.parse_expr(self._cast(ctx, ret, ctx.code(arg.value), batched)))
                    done.append(f"line {line}")
                    continue
            stmt = ctx.parent(ret)
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                raise _Skip(f"{ctx.filename}:{line}: the return shares its line with other code; not rewritten")
            if isinstance(value, cst.Name):
                name, before = value.value, []
            else:
                name = next(n for n in ("outputs", "result", "fixed_outputs") if not ctx.scope_has(ret, n))
                before = [ctx.parse_stmt(f"{name} = {ctx.code(value)}\n")]
                ctx.replace(value, cst.Name(name))
            item = f"{name}[{key}]"
            before.append(ctx.parse_stmt(f"{item} = {self._cast(ctx, ret, item, batched)}\n"))
            ctx.insert_before(stmt, before)
            done.append(f"line {line}")
        return f"{where}: {self.key} cast to {self.to_dtype} where it is returned ({', '.join(done)})"
