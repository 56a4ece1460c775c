"""The editing context every LibCST codemod works through: the one analysis of the file
(dtype_doctor.source.analysis) plus edits recorded by node identity and applied in one pass,
and small CST builders.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import libcst as cst

from dtype_doctor.fix.codemods.base import _Skip, Codemod
from dtype_doctor.source.analysis import SourceAnalysis, dotted, walk  # noqa: F401 - codemods import these from here


# ---------------------------------------------------------------------------------------
# Editing context: the analysis, and edits recorded by node identity


class _Ctx(SourceAnalysis):
    """The analysis of the file being edited, plus the edits a codemod records on it."""

    def __init__(self, source: str, filename: str, warnings: list[str]):
        super().__init__(source, filename)
        self.warnings = warnings
        self.need_torch_import = False
        self._node_edits: dict[int, list[Callable[[Any], Any]]] = {}
        self._block_ops: dict[int, list[tuple[Any, ...]]] = {}

    def warn(self, message: str) -> None:
        self.warnings.append(message)

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

    # edits

    def replace(self, node: cst.CSTNode, new: cst.CSTNode | Callable[[Any], Any]) -> None:
        fn = new if callable(new) else (lambda _updated, _new=new: _new)
        self._node_edits.setdefault(id(node), []).append(fn)

    def insert_before(self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> None:
        block, index = self._block_of(stmt)
        self._block_ops.setdefault(id(block), []).append(("insert", index, list(new)))

    def insert_after(self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> None:
        block, index = self._block_of(stmt)
        self._block_ops.setdefault(id(block), []).append(("after", index + 1, list(new)))

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
        if kind == "after":  # right below the statement: the blank lines above the next one stay there
            body[index:index] = list(op[2])
        elif kind == "insert":
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
    following = body[insert_at + 1] if insert_at + 1 < len(body) else None
    if (insert_at == 0 or after_docstring) and isinstance(following, (cst.FunctionDef, cst.ClassDef)):
        # The file's first import right above a def: two blank lines between them (PEP 8, E302).
        lead = list(following.leading_lines)
        blanks = next((i for i, x in enumerate(lead) if not _is_blank(x)), len(lead))
        if blanks < 2:
            body[insert_at + 1] = following.with_changes(leading_lines=[cst.EmptyLine()] * (2 - blanks) + lead)
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


class _CSTCodemod(Codemod):
    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        ctx = _Ctx(source, filename, warnings)
        detail = self._edit(ctx)
        return ctx.render(), detail

    @abstractmethod
    def _edit(self, ctx: _Ctx) -> str:
        """Record edits on ctx and return the detail line, or raise _Skip."""
