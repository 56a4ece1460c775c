"""The user's quantization config: SetConfigKeyword sets one keyword of their BitsAndBytesConfig(...) call."""

from __future__ import annotations

from typing import Callable, ClassVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from dtype_doctor.fix.codemods.base import Codemod, _Skip
from dtype_doctor.fix.codemods.context import _append_arg, _kwarg


def _callee(call: cst.Call) -> str | None:
    f = call.func
    if isinstance(f, cst.Name):
        return f.value
    if isinstance(f, cst.Attribute):
        return f.attr.value
    return None


def the_one_call(module: cst.Module, matches: Callable[[cst.Call], bool], none: str, many: str) -> cst.Call:
    """The single call in `module` that `matches`; a skip saying `none`, or `many` (with the count
    in front), when there is none or more than one — which of several is meant is not known."""
    calls: list[cst.Call] = []

    class Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if matches(node):
                calls.append(node)

    module.visit(Find())
    if not calls:
        raise _Skip(none)
    if len(calls) > 1:
        raise _Skip(f"{len(calls)} {many}")
    return calls[0]


def with_keyword(
    module: cst.Module, target: cst.Call, keyword: str, value_for: Callable[[cst.BaseExpression | None], cst.BaseExpression]
) -> tuple[str, int]:
    """`module`'s source with `target`'s `keyword=` argument set to `value_for(its old value)` (None
    when the call has none: it is appended, keeping the call's layout), and the call's line."""

    class Edit(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            if original is not target:
                return updated
            args = list(updated.args)
            for i, a in enumerate(args):
                if a.keyword is not None and a.keyword.value == keyword:
                    args[i] = a.with_changes(value=value_for(a.value))
                    return updated.with_changes(args=args)
            return _append_arg(updated, _kwarg(keyword, value_for(None)))

    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)  # the same nodes: `target` is one
    return module.visit(Edit()).code, positions[target].start.line


def _imports_torch(module: cst.Module) -> bool:
    for stmt in module.body:
        for small in getattr(stmt, "body", ()):
            if isinstance(small, cst.Import) and any(
                isinstance(a.name, cst.Name) and a.name.value == "torch" and a.asname is None for a in small.names
            ):
                return True
    return False


class SetConfigKeyword(Codemod):
    """`BitsAndBytesConfig(load_in_4bit=True)` → `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)`."""

    DESCRIPTION: ClassVar[str] = "set one keyword of the script's BitsAndBytesConfig(...) call to a dtype (or a flag to True/False)"

    def __init__(self, keyword: str, dtype: str, callee: str = "BitsAndBytesConfig") -> None:
        self.keyword, self.dtype, self.callee = keyword, dtype, callee

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        module = cst.parse_module(source)
        target = the_one_call(module, lambda node: _callee(node) == self.callee, f"no {self.callee}(...) call in {filename}",
                              f"{self.callee}(...) calls in {filename}; which one loads the model is not known")
        # torch.bfloat16 where the file imports torch; the name as a string (which BitsAndBytesConfig also takes) where not
        if self.dtype in ("True", "False"):  # a flag (llm_int8_enable_fp32_cpu_offload), not a dtype
            value: cst.BaseExpression = cst.Name(self.dtype)
        else:
            value = cst.parse_expression(f"torch.{self.dtype}" if _imports_torch(module) else repr(self.dtype))
        keyword = self.keyword

        new_source, line = with_keyword(module, target, keyword, lambda old: value)
        return new_source, f"{self.callee}(...) at {filename}:{line}: {keyword}={cst.Module([]).code_for_node(value)}"
