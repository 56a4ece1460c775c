"""Codemods that edit the dtype casts in the user's own function (``--preprocess FILE.py:FUNC``,
or a script's label building): RetargetCast, CastLabelsToLong, and CastReturnedValue for
when the function casts nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst

from dtype_doctor.fix.codemods.base import DTYPE_METHODS, dtype_family, INTEGER, NUMPY_DTYPES, _Skip, normalize_dtype
from dtype_doctor.fix.codemods.context import _CSTCodemod, _Ctx, dotted
from dtype_doctor.source.analysis import cast_sites, dtype_of, key_of, label_values, CastSite, values_for  # noqa: F401


# ---------------------------------------------------------------------------------------
# Rewriting casts (found by dtype_doctor.source.analysis)


def _retarget(ctx: _Ctx, site: CastSite, to: str) -> cst.CSTNode | None:
    """The node that replaces site.node to cast to `to` in the same style; None when impossible."""
    node = site.node
    if site.kind == "builtin":
        family = dtype_family(to)
        return cst.Name("float" if family == "floating" else "int") if family in ("floating", "integer") else None
    if site.kind == "method":
        return cst.Name(DTYPE_METHODS[to]) if to in DTYPE_METHODS else None
    if site.lib in ("str", "numpy") and to not in NUMPY_DTYPES.values():
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


# Python's own casts, and the dtype torch.tensor makes of what they return.
_BUILTINS = {"float": "float32", "int": "int64", "bool": "bool"}


def _builtin_sites(ctx: _Ctx, scope: cst.CSTNode) -> list[CastSite]:
    """`float(x)`, `int(x)`: the casts a function makes plain values with (a map function's labels)."""
    from dtype_doctor.source.analysis import walk

    return [CastSite(node.func, "builtin", "builtin", _BUILTINS[node.func.value], ctx.line(node))
            for node in walk(scope) if isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
            and node.func.value in _BUILTINS and len(node.args) == 1]


def _describe(ctx: _Ctx, site: CastSite) -> str:
    if site.kind == "method":
        return f".{ctx.code(site.node)}()"
    return ctx.code(site.node)


def _rewrite_sites(ctx: _Ctx, sites: Sequence[CastSite], to: str) -> list[str]:
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

    ``function=None`` searches the whole file (a script's top-level code) instead of one function.
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
        function: str | None,
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
        # function=None: the whole file (a script's top-level code), located by `lines` or `key`.
        fn = ctx.function(self.function) if self.function else ctx.module
        where = (f"{ctx.filename}:{self.function}" if self.function else ctx.filename) + (f" ({self.key})" if self.key else "")
        family = dtype_family(self.to_dtype)
        if self.key is None:
            sites = [s for s in cast_sites(ctx, fn) if self.lines is not None or dtype_family(s.dtype) == family]
        else:
            found = {id(s.node): s for v in values_for(fn, lambda name: name == self.key) for s in cast_sites(ctx, v)}
            sites = sorted(found.values(), key=lambda s: (s.line, ctx.span(s.node).start.column))
        if self.lines is not None:
            sites = [s for s in sites if ctx.on_lines(s.node, self.lines)]
            # No torch or numpy cast on the lineage's line: a Python one there (`float(label)`) made the values.
            sites = sites or [s for s in _builtin_sites(ctx, fn) if ctx.on_lines(s.node, self.lines)]
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


def _label_int_sites(ctx: _Ctx, scope: cst.CSTNode, lines: frozenset[int] | None) -> list[CastSite]:
    sites: dict[int, CastSite] = {}
    for value in label_values(scope):
        for site in cast_sites(ctx, value):
            if site.dtype in INTEGER and site.dtype != "int64" and (lines is None or ctx.on_lines(site.node, lines)):
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


class CastReturnedValue(_CSTCodemod):
    """Cast one output of a function where the function returns it.

    For when no cast in the function sets the dtype (ids built by numpy arithmetic, a list of
    Python floats): ``return {"input_ids": ids}`` → ``{"input_ids": torch.as_tensor(ids,
    dtype=torch.int64)}``; ``return out`` → ``out["input_ids"] = …`` on the line before;
    any other returned mapping is bound to a name first. Every return of the function is
    cast, however it is written (``if done: return out`` becomes a block); a returned literal
    without the key is left as it is. Written with torch when the file
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
        if numpy and not ctx.imports.top_level_torch and self.to_dtype in NUMPY_DTYPES.values():
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
        returns = ctx.own_returns(fn)
        if not returns:
            raise _Skip(f"{where} returns nothing to cast")
        batched = ctx.is_batched(fn)
        key = repr(self.key).replace("'", '"')
        done = []
        for ret in returns:
            value = ret.value
            assert value is not None
            line = ctx.line(ret)
            if isinstance(value, cst.Dict):
                el = next((e for e in value.elements if isinstance(e, cst.DictElement) and key_of(e.key) == self.key), None)
                if el is not None:
                    ctx.replace(el.value, ctx.parse_expr(self._cast(ctx, ret, ctx.code(el.value), batched)))
                    done.append(f"line {line}")
                continue  # a literal without the key does not return it here
            if isinstance(value, cst.Call) and dotted(value.func) == "dict" and not any(a.star for a in value.args):
                arg = next((a for a in value.args if a.keyword is not None and a.keyword.value == self.key), None)
                if arg is not None:
                    ctx.replace(arg.value, ctx.parse_expr(self._cast(ctx, ret, ctx.code(arg.value), batched)))
                    done.append(f"line {line}")
                continue
            if isinstance(value, cst.Name):
                name, before = value.value, []
            else:
                name = next(n for n in ("outputs", "result", "fixed_outputs") if not ctx.scope_has(ret, n))
                before = [f"{name} = {ctx.code(value)}"]
                ctx.replace(value, cst.Name(name))
            item = f"{name}[{key}]"
            before.append(f"{item} = {self._cast(ctx, ret, item, batched)}")
            _run_before(ctx, ret, [ctx.parse_stmt(code + "\n").body[0] for code in before])
            done.append(f"line {line}")
        if not done:
            raise _Skip(f"no return of {where} holds {self.key}")
        return f"{where}: {self.key} cast to {self.to_dtype} where it is returned ({', '.join(done)})"


def _run_before(ctx: _Ctx, ret: cst.Return, new: list[cst.BaseSmallStatement]) -> None:
    """Run the small statements `new` right before the return `ret`, however it is written:
    on lines of their own above it, in its own line after a `;` (``x = 1; return out``), or in
    a block that replaces a one-line suite (``if done: return out``)."""
    holder = ctx.parent(ret)
    if isinstance(holder, cst.SimpleStatementLine) and len(holder.body) == 1:
        ctx.insert_before(holder, [cst.SimpleStatementLine(body=[s]) for s in new])
        return
    if not isinstance(holder, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        raise _Skip(f"{ctx.filename}:{ctx.line(ret)}: the return is in no statement line; not rewritten")
    index = next(i for i, s in enumerate(holder.body) if s is ret)
    if isinstance(holder, cst.SimpleStatementLine):

        def inject(updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
            body = list(updated.body)
            body[index:index] = new
            return updated.with_changes(body=body)

        ctx.replace(holder, inject)
        return

    def expand(updated: cst.SimpleStatementSuite) -> cst.IndentedBlock:
        # `if done: return out` becomes a block, one statement a line, the cast above the return.
        small = list(updated.body)
        small[index:index] = new
        lines = [cst.SimpleStatementLine(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]) for s in small]
        return cst.IndentedBlock(body=lines, header=updated.trailing_whitespace)

    ctx.replace(holder, expand)
