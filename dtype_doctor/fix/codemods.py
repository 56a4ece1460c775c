"""Source patches: the fix strategies of SPEC.md as LibCST codemods on the user's own code.

One class per transformation, each with a one-line DESCRIPTION, constructed with its
parameters and applied with ``apply(source, filename) -> EditResult``. A codemod never
raises and never guesses: when its target is missing, or found more than once where one
is meant, it returns ``skipped`` with the reason; an internal error is ``failed``. Only
the nodes a codemod rewrites change, so every other byte of the file (formatting,
comments, blank lines) comes back exactly as it was and the diff stays minimal.

Codemods for a preprocessing file (``--preprocess FILE.py:FUNC``):
    RetargetCast, CastLabelsToLong
Codemods for a pipeline script (``--script FILE.py``):
    SetLoadDtype, RemoveModelConversion, ReplaceModelConversion, WrapForwardInAutocast,
    MoveBatchToDevice, CastBatch, LabelsToLong
When there is no user code to patch:
    NewFixModule (the text of a new ``dtype_doctor_fix.py``)

No torch import here: the codemods read source text only.
"""

from __future__ import annotations

import re
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import libcst as cst
from libcst.metadata import (
    CodeRange,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    ScopeProvider,
)

__all__ = [
    "EditResult",
    "Codemod",
    "RetargetCast",
    "CastLabelsToLong",
    "SetLoadDtype",
    "RemoveModelConversion",
    "ReplaceModelConversion",
    "WrapForwardInAutocast",
    "MoveBatchToDevice",
    "CastBatch",
    "LabelsToLong",
    "NewFixModule",
    "run_codemods",
    "normalize_dtype",
]

Status = Literal["applied", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class EditResult:
    """What one codemod did to one file. ``new_source`` is set only when applied."""

    status: Status
    codemod: str
    detail: str
    new_source: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def applied(self) -> bool:
        return self.status == "applied"

    def to_dict(self) -> dict[str, Any]:
        return {
            "codemod": self.codemod,
            "status": self.status,
            "detail": self.detail,
            "warnings": list(self.warnings),
        }


def run_codemods(source: str, filename: str, codemods: Iterable[Codemod]) -> tuple[str, tuple[EditResult, ...]]:
    """Apply codemods in order, each to the previous one's output; return the final text."""
    results = []
    current = source
    for codemod in codemods:
        result = codemod.apply(current, filename)
        results.append(result)
        if result.applied and result.new_source is not None:
            current = result.new_source
    return current, tuple(results)


# ---------------------------------------------------------------------------------------
# dtype vocabulary

_TORCH_DTYPES = {
    "float16": "float16", "half": "float16",
    "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64",
    "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64",
    "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool",
}  # fmt: skip
_NUMPY_DTYPES = {
    "float16": "float16", "half": "float16",
    "float32": "float32", "single": "float32",
    "float64": "float64", "double": "float64",
    "int64": "int64", "int32": "int32", "intc": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8",
}  # fmt: skip
_STRING_DTYPES = {"float16", "float32", "float64", "bfloat16", "int64", "int32", "int16", "int8", "uint8"}
_EXTRA_ALIASES = {"fp16": "float16", "fp32": "float32", "fp64": "float64", "bf16": "bfloat16"}
# Tensor methods that cast, and the method that casts to each dtype.
_METHOD_DTYPES = {
    "half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16",
    "long": "int64", "int": "int32", "short": "int16", "char": "int8", "byte": "uint8",
}  # fmt: skip
_DTYPE_METHODS = {v: k for k, v in _METHOD_DTYPES.items()}
_FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
_HALF = frozenset({"float16", "bfloat16"})
_INTEGER = frozenset({"int8", "int16", "int32", "int64", "uint8"})
_CAST_METHODS = ("to", "type", "astype")


def normalize_dtype(name: str) -> str:
    """``"torch.half"`` / ``"fp16"`` / ``"float16"`` → ``"float16"``; raises ValueError when unknown."""
    key = name.strip()
    for prefix in ("torch.", "np.", "numpy."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    canon = _TORCH_DTYPES.get(key) or _EXTRA_ALIASES.get(key)
    if canon is None:
        raise ValueError(f"unknown dtype {name!r}")
    return canon


def _family(dtype: str) -> str:
    return "floating" if dtype in _FLOATING else "integer" if dtype in _INTEGER else dtype


# ---------------------------------------------------------------------------------------
# Codemod base


class _Skip(Exception):
    """Raised inside a codemod to end it with status "skipped" and this reason."""


class Codemod(ABC):
    """One source transformation. Subclasses set DESCRIPTION and implement ``_apply``."""

    DESCRIPTION: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    def apply(self, source: str, filename: str) -> EditResult:
        warnings: list[str] = []
        try:
            new_source, detail = self._apply(source, filename, warnings)
        except _Skip as skip:
            return EditResult("skipped", self.name, str(skip), None, tuple(warnings))
        except cst.ParserSyntaxError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
            return EditResult("failed", self.name, f"cannot parse {filename}: {first}", None, tuple(warnings))
        except Exception as exc:  # a codemod bug must not take the fix command down
            return EditResult(
                "failed", self.name, f"{self.name} failed on {filename}: {type(exc).__name__}: {exc}", None, tuple(warnings)
            )
        if new_source == source:
            return EditResult("skipped", self.name, f"nothing to change in {filename}", None, tuple(warnings))
        problem = _compile_problem(source, new_source, filename)
        if problem:
            return EditResult("failed", self.name, problem, None, tuple(warnings))
        return EditResult("applied", self.name, detail, new_source, tuple(warnings))

    @abstractmethod
    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        """Return (new source, detail) or raise _Skip(reason)."""


def _compile_problem(before: str, after: str, filename: str) -> str | None:
    try:
        compile(before, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None  # the original does not compile here either; nothing to compare against
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"the rewritten {filename} would not compile ({exc}); left unchanged"
    return None


class _CSTCodemod(Codemod):
    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        ctx = _Ctx(source, filename, warnings)
        detail = self._edit(ctx)
        return ctx.render(), detail

    @abstractmethod
    def _edit(self, ctx: _Ctx) -> str:
        """Record edits on ctx and return the detail line, or raise _Skip."""


# ---------------------------------------------------------------------------------------
# Parsing context: metadata, lookups, and edits recorded by node identity


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    collector = _Collector()
    node.visit(collector)
    return collector.nodes


def _dotted(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


@dataclass
class _Imports:
    torch: set[str] = field(default_factory=lambda: {"torch"})
    numpy: set[str] = field(default_factory=lambda: {"np", "numpy"})
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # `from torch import float16`
    top_level_torch: str | None = None  # a module-level name bound to torch, reusable anywhere

    @classmethod
    def of(cls, module: cst.Module, nodes: Sequence[cst.CSTNode]) -> _Imports:
        imports = cls()
        top_level = {id(stmt) for line in module.body if isinstance(line, cst.SimpleStatementLine) for stmt in line.body}
        for node in nodes:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = _dotted(alias.name)
                    local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else full
                    if full and full.startswith("torch.") and alias.asname is None:
                        full = local = "torch"  # `import torch.nn` binds `torch`
                    if full == "torch" and local:
                        imports.torch.add(local)
                        if id(node) in top_level and (imports.top_level_torch is None or local == "torch"):
                            imports.top_level_torch = local
                    elif full == "numpy" and local:
                        imports.numpy.add(local)
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                lib = {"torch": "torch", "numpy": "numpy"}.get(_dotted(node.module) if node.module else "")
                if lib is None:
                    continue
                table = _TORCH_DTYPES if lib == "torch" else _NUMPY_DTYPES
                for alias in node.names:
                    name = alias.name.value if isinstance(alias.name, cst.Name) else None
                    local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
                    if name in table and local:
                        imports.names[local] = (lib, table[name])
        return imports


class _Ctx:
    def __init__(self, source: str, filename: str, warnings: list[str]):
        self.filename = filename
        self.warnings = warnings
        self.wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._positions = self.wrapper.resolve(PositionProvider)
        self._parents = self.wrapper.resolve(ParentNodeProvider)
        self._scopes: Mapping[cst.CSTNode, Any] | None = None
        self.nodes = _walk(self.module)
        self.imports = _Imports.of(self.module, self.nodes)
        self.need_torch_import = False
        self._node_edits: dict[int, list[Callable[[Any], Any]]] = {}
        self._block_ops: dict[int, list[tuple[Any, ...]]] = {}

    # lookups

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def span(self, node: cst.CSTNode) -> CodeRange:
        return self._positions[node]

    def line(self, node: cst.CSTNode) -> int:
        return self._positions[node].start.line

    def covers(self, node: cst.CSTNode, line: int) -> bool:
        span = self._positions[node]
        return span.start.line <= line <= span.end.line

    def on_lines(self, node: cst.CSTNode, lines: frozenset[int]) -> bool:
        """node is on one of lines, or in a statement that spans one of them."""
        if self.line(node) in lines:
            return True
        for anc in self.ancestors(node):
            if isinstance(anc, cst.BaseCompoundStatement):  # a header: its span is the whole block
                return False
            if isinstance(anc, cst.BaseSmallStatement):
                span = self.span(anc)
                return any(span.start.line <= n <= span.end.line for n in lines)
        return False

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self._parents.get(node)
        while cur is not None:
            yield cur
            cur = self._parents.get(cur)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def snippet(self, node: cst.CSTNode, limit: int = 60) -> str:
        text = " ".join(self.code(node).split())
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def scope_has(self, node: cst.CSTNode, name: str) -> bool:
        if self._scopes is None:
            self._scopes = self.wrapper.resolve(ScopeProvider)
        scope = self._scopes.get(node)
        return scope is not None and name in scope

    def torch_name(self) -> str:
        """The name to write torch under in new code; adds `import torch` when there is none."""
        if self.imports.top_level_torch:
            return self.imports.top_level_torch
        self.need_torch_import = True
        return "torch"

    def parse_expr(self, code: str) -> cst.BaseExpression:
        return cst.parse_expression(code, config=self.module.config_for_parsing)

    def parse_stmt(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code, config=self.module.config_for_parsing)

    def function(self, qualname: str) -> cst.CSTNode:
        """The def (or `name = lambda ...`) called qualname ("func" or "Class.method")."""
        *owners, name = qualname.split(".")
        found: list[cst.CSTNode] = []
        for node in self.nodes:
            if isinstance(node, cst.FunctionDef) and node.name.value == name:
                classes = [a.name.value for a in self.ancestors(node) if isinstance(a, cst.ClassDef)]
                if not owners or list(reversed(classes))[-len(owners) :] == owners:
                    found.append(node)
            elif (
                not owners
                and isinstance(node, cst.Assign)
                and isinstance(node.value, cst.Lambda)
                and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
            ):
                found.append(node.value)
        if not found:
            raise _Skip(f"no function {qualname}() in {self.filename}")
        if len(found) > 1:
            lines = ", ".join(str(self.line(n)) for n in found)
            raise _Skip(f"{len(found)} functions named {qualname} in {self.filename} (lines {lines}); ambiguous")
        return found[0]

    # edits

    def replace(self, node: cst.CSTNode, new: cst.CSTNode | Callable[[Any], Any]) -> None:
        fn = new if callable(new) else (lambda _updated, _new=new: _new)
        self._node_edits.setdefault(id(node), []).append(fn)

    def insert_before(self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> None:
        block, index = self._block_of(stmt)
        self._block_ops.setdefault(id(block), []).append(("insert", index, list(new)))

    def remove_statement(self, stmt: cst.BaseStatement) -> None:
        block, index = self._block_of(stmt)
        self._block_ops.setdefault(id(block), []).append(("remove", index))

    def wrap_statements(
        self, first: cst.BaseStatement, last: cst.BaseStatement, build: Callable[[list[Any]], cst.BaseStatement]
    ) -> None:
        block, i = self._block_of(first)
        _, j = self._block_of(last)
        self._block_ops.setdefault(id(block), []).append(("wrap", i, j, build))

    def _block_of(self, stmt: cst.CSTNode) -> tuple[cst.CSTNode, int]:
        block = self.parent(stmt)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            raise _Skip(f"line {self.line(stmt)} of {self.filename} is not a statement of its own")
        for index, child in enumerate(block.body):
            if child is stmt:
                return block, index
        raise _Skip(f"line {self.line(stmt)} of {self.filename}: statement not found in its block")

    def render(self) -> str:
        module = self.module.visit(_Editor(self._node_edits, self._block_ops))
        if self.need_torch_import and not self.imports.top_level_torch:
            module = _add_import(module, "import torch")
        return module.code


class _Editor(cst.CSTTransformer):
    """Applies the edits recorded on a _Ctx, matching nodes by identity."""

    def __init__(self, node_edits: Mapping[int, list[Callable[[Any], Any]]], block_ops: Mapping[int, list[tuple[Any, ...]]]):
        super().__init__()
        self.node_edits = node_edits
        self.block_ops = block_ops

    def on_leave(self, original_node, updated_node):
        key = id(original_node)
        for fn in self.node_edits.get(key, ()):
            updated_node = fn(updated_node)
        ops = self.block_ops.get(key)
        if ops:
            updated_node = _apply_block_ops(updated_node, ops)
        return updated_node


def _is_blank(line: cst.EmptyLine) -> bool:
    return line.comment is None


def _detached(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """The leading lines up to the last blank one: what is not attached to the statement."""
    last_blank = max((i for i, x in enumerate(lines) if _is_blank(x)), default=-1)
    return list(lines[: last_blank + 1])


def _apply_block_ops(block: Any, ops: list[tuple[Any, ...]]) -> Any:
    body = list(block.body)
    footer = list(block.footer)
    # Descending order keeps the recorded indexes valid while the body changes.
    for op in sorted(ops, key=lambda o: o[1], reverse=True):
        kind, index = op[0], op[1]
        if kind == "insert":
            new = list(op[2])
            lead = list(body[index].leading_lines)
            k = 0
            while k < len(lead) and _is_blank(lead[k]):
                k += 1
            # Blank lines stay above the inserted code; comments stay with the line they describe.
            new[0] = new[0].with_changes(leading_lines=lead[:k])
            body[index] = body[index].with_changes(leading_lines=lead[k:])
            body[index:index] = new
        elif kind == "remove":
            removed = body.pop(index)
            # Comment lines right above the removed line describe it and go with it.
            lead = _detached(removed.leading_lines)
            if index < len(body):
                nxt = list(body[index].leading_lines)
                if all(_is_blank(x) for x in lead):
                    merged = nxt if nxt else lead
                else:
                    merged = lead + nxt
                body[index] = body[index].with_changes(leading_lines=merged)
            elif body:
                footer = [x for x in lead if not _is_blank(x)] + footer
            if not body:
                body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=lead)]
        elif kind == "wrap":
            j, build = op[2], op[3]
            body[index : j + 1] = [build(body[index : j + 1])]
    return block.with_changes(body=body, footer=footer)


def _add_import(module: cst.Module, code: str) -> cst.Module:
    """Insert an import after the module's leading imports (after the docstring when none)."""
    stmt = cst.parse_statement(code + "\n", config=module.config_for_parsing)
    body = list(module.body)
    insert_at = 0
    after_docstring = False
    for i, line in enumerate(body):
        if not isinstance(line, cst.SimpleStatementLine):
            break
        if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body):
            insert_at = i + 1
            after_docstring = False
        elif i == 0 and len(line.body) == 1 and isinstance(line.body[0], cst.Expr) and isinstance(
            line.body[0].value, (cst.SimpleString, cst.ConcatenatedString)
        ):
            insert_at = 1
            after_docstring = True
        else:
            break
    if after_docstring:
        stmt = stmt.with_changes(leading_lines=[cst.EmptyLine()])
    body.insert(insert_at, stmt)
    return module.with_changes(body=body)


# ---------------------------------------------------------------------------------------
# Small CST builders


def _atomic(expr: cst.BaseExpression) -> cst.BaseExpression:
    """expr, parenthesized when a following `.attr` would bind to only part of it."""
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript, cst.Call, cst.List, cst.Dict, cst.Tuple)) or expr.lpar:
        return expr
    return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _method_call(expr: cst.BaseExpression, method: str, args: Sequence[cst.Arg] = ()) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=_atomic(expr), attr=cst.Name(method)), args=list(args))


def _clean_ws(ws: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    return ws.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())


def _append_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """call with `new` as its last argument, laid out like the arguments already there."""
    args = list(call.args)
    keyword_args = [a for a in args if a.keyword is not None and isinstance(a.equal, cst.AssignEqual)]
    if keyword_args and new.keyword is not None:
        new = new.with_changes(equal=keyword_args[-1].equal)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        sep_ws = args[-2].comma.whitespace_after
    else:
        sep_ws = call.whitespace_before_args
    multiline = isinstance(sep_ws, cst.ParenthesizedWhitespace)
    separator = cst.Comma(
        whitespace_before=cst.SimpleWhitespace(""),
        whitespace_after=_clean_ws(sep_ws) if multiline else cst.SimpleWhitespace(" "),
    )
    if isinstance(last.comma, cst.Comma):  # trailing comma: the new argument inherits it
        trailing = last.comma
        if isinstance(trailing.whitespace_after, cst.ParenthesizedWhitespace) and multiline:
            kept = trailing.with_changes(
                whitespace_after=trailing.whitespace_after.with_changes(
                    indent=separator.whitespace_after.indent, last_line=separator.whitespace_after.last_line
                )
            )
            new = new.with_changes(
                comma=cst.Comma(whitespace_after=_clean_ws(trailing.whitespace_after)),
                whitespace_after_arg=last.whitespace_after_arg,
            )
            args[-1] = last.with_changes(comma=kept, whitespace_after_arg=cst.SimpleWhitespace(""))
        else:
            new = new.with_changes(comma=trailing, whitespace_after_arg=last.whitespace_after_arg)
            args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    else:
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(comma=separator, whitespace_after_arg=cst.SimpleWhitespace(""))
    return call.with_changes(args=[*args, new])


def _remove_arg(call: cst.Call, index: int) -> cst.Call:
    args = list(call.args)
    removed = args.pop(index)
    if index == len(args) and index > 0:  # the removed one was last: its predecessor takes its ending
        args[index - 1] = args[index - 1].with_changes(
            comma=removed.comma, whitespace_after_arg=removed.whitespace_after_arg
        )
    return call.with_changes(args=args)


def _kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def _arg_name(arg: cst.Arg) -> str | None:
    return arg.keyword.value if arg.keyword is not None else None


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

    Only casts in the same family as ``to_dtype`` (floating or integer) that cast to
    another dtype are candidates; ``from_dtype`` and ``lines`` narrow them further. All
    candidates are rewritten when they agree on one source dtype; casts to different
    dtypes with neither filter given are ambiguous and skipped.
    """

    DESCRIPTION = "Rewrite the dtype cast inside a preprocessing function to the dtype the model expects."

    def __init__(
        self,
        function: str,
        to_dtype: str,
        *,
        from_dtype: str | None = None,
        lines: Iterable[int] | None = None,
    ):
        self.function = function
        self.to_dtype = normalize_dtype(to_dtype)
        self.from_dtype = normalize_dtype(from_dtype) if from_dtype else None
        self.lines = frozenset(lines) if lines is not None else None

    def _edit(self, ctx: _Ctx) -> str:
        fn = ctx.function(self.function)
        where = f"{ctx.filename}:{self.function}"
        family = _family(self.to_dtype)
        sites = [s for s in _cast_sites(ctx, fn) if _family(s.dtype) == family]
        if self.lines is not None:
            sites = [s for s in sites if ctx.on_lines(s.node, self.lines)]
        if self.from_dtype:
            sites = [s for s in sites if s.dtype == self.from_dtype]
        todo = [s for s in sites if s.dtype != self.to_dtype]
        on_lines = f" on line {', '.join(map(str, sorted(self.lines)))}" if self.lines else ""
        if not todo:
            if sites:
                raise _Skip(f"the casts in {where}{on_lines} already cast to {self.to_dtype}")
            what = f"{self.from_dtype} cast" if self.from_dtype else f"{family} cast"
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


def _label_target(target: cst.BaseExpression) -> bool:
    if isinstance(target, cst.Name):
        return _is_label_name(target.value)
    if isinstance(target, cst.Attribute):
        return _is_label_name(target.attr.value)
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
            return isinstance(key, str) and _is_label_name(key)
    return False


def _label_values(scope: cst.CSTNode) -> list[cst.BaseExpression]:
    """Expressions whose value ends up as labels: `labels = …`, `{"labels": …}`, `labels=…`."""
    nodes = _walk(scope)
    values: list[cst.BaseExpression] = []
    for node in nodes:
        if isinstance(node, cst.Assign) and any(_label_target(t.target) for t in node.targets):
            values.append(node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None and _label_target(node.target):
            values.append(node.value)
        elif isinstance(node, cst.Dict):
            for el in node.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                    key = el.key.evaluated_value
                    if isinstance(key, str) and _is_label_name(key):
                        values.append(el.value)
        elif isinstance(node, cst.Arg) and node.keyword is not None and _is_label_name(node.keyword.value):
            values.append(node.value)
    # `y = np.array(..., dtype=np.int32); return {"labels": y}`: follow names to their assignments.
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
        cls = _dotted(node.func.value)
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
        found = _dtype_of(value, ctx.imports)
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
    dtype: str
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


def _conversion(ctx: _Ctx, link: cst.Call) -> _Conversion | None:
    attr = link.func.attr.value  # type: ignore[union-attr]
    if attr in _METHOD_DTYPES and attr in ("half", "float", "double", "bfloat16") and not link.args:
        return _Conversion(link, _METHOD_DTYPES[attr], None, False)
    if attr in ("to", "type"):
        for i, arg in enumerate(link.args):
            if arg.keyword is None or arg.keyword.value == "dtype":
                found = _dtype_of(arg.value, ctx.imports)
                if found and found[0] == "torch" and found[1] in _FLOATING:
                    return _Conversion(link, found[1], i, len(link.args) > 1)
    return None


@dataclass(frozen=True)
class _ChainStatement:
    small: cst.BaseSmallStatement
    line_stmt: cst.SimpleStatementLine
    value: cst.BaseExpression
    root: cst.BaseExpression  # model variable or the from_pretrained call
    links: list[cst.Call]  # after the root
    conversions: list[_Conversion]


def _model_conversions(ctx: _Ctx, variable: str | None) -> list[_ChainStatement]:
    names, load_ids = _model_names(ctx, variable, fallback=False)
    if not names and not load_ids:
        raise _Skip(f"no from_pretrained(...) call found in {ctx.filename}")
    found = []
    for node in ctx.nodes:
        if not isinstance(node, cst.SimpleStatementLine):
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
            elif ctx.code(base) in names:
                root, rest = base, links
            else:
                continue
            conversions = [c for c in (_conversion(ctx, link) for link in rest) if c]
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
    def __init__(self, *, from_dtype: str | None = None, variable: str | None = None):
        self.from_dtype = normalize_dtype(from_dtype) if from_dtype else None
        self.variable = variable

    def _wanted(self, conv: _Conversion, to: str) -> bool:
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
        statements = _model_conversions(ctx, self.variable)
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

    def __init__(self, to_dtype: str, *, from_dtype: str | None = None, variable: str | None = None):
        super().__init__(from_dtype=from_dtype, variable=variable)
        self.to_dtype = normalize_dtype(to_dtype)
        if self.to_dtype not in _FLOATING:
            raise ValueError(f"ReplaceModelConversion converts to a floating dtype, not {to_dtype!r}")

    def _edit(self, ctx: _Ctx) -> str:
        statements = _model_conversions(ctx, self.variable)
        changes = []
        for st in statements:
            for conv in st.conversions:
                if not self._wanted(conv, self.to_dtype):
                    continue
                line = ctx.line(conv.link)
                if conv.dtype_arg is None:
                    attr = conv.link.func.attr  # type: ignore[union-attr]
                    ctx.replace(attr, cst.Name(_DTYPE_METHODS[self.to_dtype]))
                    changes.append(f"line {line}: .{attr.value}() → .{_DTYPE_METHODS[self.to_dtype]}()")
                else:
                    expr = conv.link.args[conv.dtype_arg].value
                    site = _Site(expr, "expr", "torch", conv.dtype, line)
                    changes += _rewrite_sites(ctx, [site], self.to_dtype)
        if not changes:
            raise _Skip(f"no conversion of the model to another dtype than {self.to_dtype} found in {ctx.filename}")
        return f"{ctx.filename}: model conversion now to {self.to_dtype} — " + "; ".join(changes)


# --- the forward call


def _is_autocast(ctx: _Ctx, expr: cst.BaseExpression) -> bool:
    target = expr.func if isinstance(expr, cst.Call) else expr
    name = _dotted(target) or ctx.code(target)
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
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "forward":
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
        if self.dtype not in _HALF:
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
        _arg_name(arg) in (None, "device") and not arg.star and _dtype_of(arg.value, ctx.imports) is None
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
    ``model.device``.
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
            device = f"{fwd.model}.device"
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

    For ``model(**batch)``: ``batch["pixel_values"] = batch["pixel_values"].to(model.dtype)``
    is inserted on the line before, one per key not passed as a keyword; a keyword (or a
    positional variable of that name) is wrapped: ``pixel_values=x.to(model.dtype)``.
    ``dtype=None`` casts to the model's own dtype; otherwise to ``torch.<dtype>``.
    """

    DESCRIPTION = "Cast floating batch entries to the model's dtype right before the forward."

    def __init__(
        self,
        keys: Sequence[str] = ("pixel_values",),
        dtype: str | None = None,
        *,
        variable: str | None = None,
        line: int | None = None,
    ):
        if isinstance(keys, str):
            keys = (keys,)
        if not keys or not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in keys):
            raise ValueError(f"keys must be identifiers, got {keys!r}")
        self.keys = tuple(keys)
        self.dtype = normalize_dtype(dtype) if dtype else None
        self.variable = variable
        self.line = line

    def _edit(self, ctx: _Ctx) -> str:
        fwd = _select_forward(ctx, self.variable, self.line)
        target = f"{ctx.torch_name()}.{self.dtype}" if self.dtype else f"{fwd.model}.dtype"
        keyword = {_arg_name(a): i for i, a in enumerate(fwd.call.args) if a.keyword is not None}
        positional = {
            a.value.value: i
            for i, a in enumerate(fwd.call.args)
            if a.keyword is None and not a.star and isinstance(a.value, cst.Name)
        }
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


# ---------------------------------------------------------------------------------------
# A new module when there is no user code to patch

_WHY = {
    "cast-inputs": (
        "Floating inputs are cast to the dtype of the model's weights, and integer index and\n"
        "label tensors to int64, the dtype embeddings and losses expect. The weights stay as\n"
        "they are, so nothing about the model's precision changes."
    ),
    "to-device": (
        "Every tensor in the batch is moved to the device the model's weights are on, so no\n"
        "op sees operands on two devices."
    ),
    "autocast": (
        "The forward runs under torch.autocast: weights stay float32 (the master copy an\n"
        "optimizer needs) and autocast runs each op in the dtype it is safe in."
    ),
    "half-model": (
        "The model is converted to half precision to match its inputs and save memory; the\n"
        "modules the model declares must stay float32 (_keep_in_fp32_modules) are kept float32.\n"
        "Unsafe: half precision can overflow or lose accuracy — check the parity numbers."
    ),
    "fp32-trainable": (
        "Trainable parameters are kept in float32 so the optimizer state and the gradients\n"
        "torch.amp.GradScaler unscales are float32; frozen weights keep their half dtype."
    ),
}

_USAGE = {
    "cast-inputs": "batch = apply_fix(model, batch)\noutputs = model(**batch)",
    "to-device": "batch = apply_fix(model, batch)\noutputs = model(**batch)",
    "autocast": "with apply_fix(model, batch):\n    outputs = model(**batch)",
    "half-model": "model = apply_fix(model, batch)\noutputs = model(**batch)",
    "fp32-trainable": "model = apply_fix(model, batch)\noptimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)",
}

_HELPERS = '''

def _model_dtype_and_device(model):
    """The dtype and device of the model's first floating parameter."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype, param.device
    raise ValueError("the model has no floating parameters")
'''

_BODIES = {
    "cast-inputs": '''

# Integer tensors the model uses as indices or class targets: made int64.
INDEX_KEYS = {index_keys}
# Floating tensors cast to the model's dtype; None: every floating tensor.
CAST_KEYS = {cast_keys}


def apply_fix(model, batch):
    """Return a copy of `batch` with floating tensors in {dtype_doc} and index/label tensors int64."""
    dtype = {dtype_expr}
    fixed = dict(batch)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in INDEX_KEYS and not value.is_floating_point() and value.dtype not in (torch.int64, torch.bool):
            fixed[key] = value.long()
        elif key in {{"input_ids", "token_type_ids", "position_ids"}} and value.is_floating_point():
            fixed[key] = value.long()
        elif value.is_floating_point() and (CAST_KEYS is None or key in CAST_KEYS):
            fixed[key] = value.to(dtype)
    return fixed
''',
    "to-device": '''

def apply_fix(model, batch):
    """Return a copy of `batch` with every tensor on {device_doc}."""
    device = {device_expr}
    return {{key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}}
''',
    "autocast": '''

def apply_fix(model, batch):
    """Return the torch.autocast context to run the forward of `model` on `batch` in."""
    device_type = {device_type_expr}
    return torch.autocast(device_type=device_type, dtype=torch.{dtype})
''',
    "half-model": '''

def apply_fix(model, batch):
    """Convert `model` to {dtype} in place, keeping its declared fp32 modules float32; return it."""
    model.to(torch.{dtype})
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, module in model.named_modules():
        if any(part in name.split(".") for part in keep):
            module.float()
    return model
''',
    "fp32-trainable": '''

def apply_fix(model, batch):
    """Make the trainable parameters of `model` float32 in place (frozen ones keep their dtype); return it."""
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
    return model
''',
}


def _set_literal(keys: Iterable[str]) -> str:
    # Sorted, so the module text is the same on every run.
    return "{" + ", ".join(f'"{k}"' for k in sorted(set(keys))) + "}"


class NewFixModule(Codemod):
    """The text of a new ``dtype_doctor_fix.py`` with a documented ``apply_fix(model, batch)``.

    For when neither a preprocessing file nor a script is given. ``apply`` takes the
    current text of the target file ("" when it does not exist) and skips when the file
    already has content. Strategies and their ``params``:

    - ``cast-inputs``: ``dtype`` (default: the model's), ``keys`` (floating keys to cast;
      default all), ``index_keys``; ``batch = apply_fix(model, batch)``.
    - ``to-device``: ``device`` (default: the model's device); ``batch = apply_fix(model, batch)``.
    - ``autocast``: ``dtype`` (float16), ``device_type`` (default: the model's device type);
      ``with apply_fix(model, batch): ...``.
    - ``half-model``: ``dtype`` (float16); ``model = apply_fix(model, batch)``.
    - ``fp32-trainable``: ``model = apply_fix(model, batch)``.

    Every strategy takes ``findings``: lines naming what the doctor found, for the docstring.
    """

    DESCRIPTION = "Write a small dtype_doctor_fix.py with apply_fix(model, batch) when there is no user code to patch."

    FILENAME = "dtype_doctor_fix.py"
    _INDEX_KEYS = ("input_ids", "token_type_ids", "position_ids", "decoder_input_ids", "labels", "label", "label_ids")

    def __init__(self, strategy: str, params: Mapping[str, Any] | None = None):
        self.strategy = strategy
        self.params = dict(params or {})

    def render(self) -> str:
        """The module's text; raises _Skip for an unknown strategy or bad params."""
        strategy, p = self.strategy, self.params
        if strategy not in _BODIES:
            known = ", ".join(sorted(_BODIES))
            raise _Skip(f"no fix module for strategy {strategy!r} (known: {known})")
        findings = [" ".join(str(f).split()) for f in p.get("findings", ())]
        found = "\n".join(textwrap.fill(f, 88, initial_indent="  - ", subsequent_indent="    ") for f in findings)
        doc = [
            f"Fix written by dtype-doctor (strategy: {strategy}).",
            "",
            "What the doctor found:",
            found or "  - (no findings were passed to the fix)",
            "",
            "Why this fix:",
            textwrap.indent(_WHY[strategy], "  "),
            "",
            "How to use it:",
            "",
            textwrap.indent(_USAGE[strategy], "    "),
        ]
        docstring = '"""' + "\n".join(doc).replace('"""', "'''").replace("\\", "\\\\") + '\n"""\n'
        fields: dict[str, Any] = {}
        if strategy == "cast-inputs":
            dtype = normalize_dtype(p["dtype"]) if p.get("dtype") else None
            keys = [str(k) for k in p.get("keys") or ()]
            index_keys = [str(k) for k in p.get("index_keys") or self._INDEX_KEYS]
            if not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in [*keys, *index_keys]):
                raise _Skip(f"batch keys must be identifiers: {keys + index_keys}")
            fields = {
                "index_keys": _set_literal(index_keys),
                "cast_keys": _set_literal(keys) if keys else "None",
                "dtype_doc": f"torch.{dtype}" if dtype else "the model's dtype",
                "dtype_expr": f"torch.{dtype}" if dtype else "_model_dtype_and_device(model)[0]",
            }
        elif strategy == "to-device":
            device = p.get("device")
            if device is not None and not re.fullmatch(r"[a-z]+(:\d+)?", str(device)):
                raise _Skip(f"bad device {device!r}")
            fields = {
                "device_doc": f'"{device}"' if device else "the model's device",
                "device_expr": f'torch.device("{device}")' if device else "_model_dtype_and_device(model)[1]",
            }
        elif strategy == "autocast":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in _HALF:
                raise _Skip(f"autocast runs in float16 or bfloat16, not {dtype}")
            device_type = p.get("device_type")
            if device_type is not None and not re.fullmatch(r"[a-z_]+", str(device_type)):
                raise _Skip(f"bad device_type {device_type!r}")
            fields = {
                "dtype": dtype,
                "device_type_expr": f'"{device_type}"' if device_type else "_model_dtype_and_device(model)[1].type",
            }
        elif strategy == "half-model":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in _HALF:
                raise _Skip(f"half-model converts to float16 or bfloat16, not {dtype}")
            fields = {"dtype": dtype}
        body = _BODIES[strategy].format(**fields)
        helpers = _HELPERS if "_model_dtype_and_device" in body else ""
        return docstring + "\nimport torch\n" + helpers + body

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        if source.strip():
            raise _Skip(f"{filename} already exists; not replacing it with a generated fix module")
        text = self.render()
        usage = _USAGE[self.strategy].splitlines()[0]
        return text, f"new {filename}: apply_fix(model, batch) for {self.strategy} — use `{usage}` before the forward"
