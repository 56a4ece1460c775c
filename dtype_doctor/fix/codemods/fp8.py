"""The user's fp8 conversion: ExcludeFromConversion leaves named layers out through its module_filter_fn.

torchao's `convert_to_float8_training(model, module_filter_fn=...)` (and its older
`swap_linear_with_float8_linear`) converts every nn.Linear the filter accepts; the filter is
called as `module_filter_fn(module, fqn)`, with the layer's fully qualified name in the model
passed. The edit is of the one conversion call in the file — torchao's by name, or any call
that already passes `module_filter_fn=` (a conversion function of the user's own written the
same way):

    convert_to_float8_training(model)
    → convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn not in {"blocks.1.proj"})

    swap_to_float8(model, module_filter_fn=keep)
    → swap_to_float8(model, module_filter_fn=lambda mod, fqn: fqn not in {"blocks.1.proj"} and (keep)(mod, fqn))

A filter this codemod wrote before gets the new names added to its set.
"""

from __future__ import annotations

from typing import ClassVar, Iterable

import libcst as cst

from dtype_doctor.fix.codemods.base import Codemod
from dtype_doctor.fix.codemods.quant import _callee, the_one_call, with_keyword

CONVERSIONS = frozenset({"convert_to_float8_training", "swap_linear_with_float8_linear"})
KEYWORD = "module_filter_fn"


def _set_literal(names: Iterable[str]) -> str:
    return "{" + ", ".join(f'"{n}"' for n in sorted(set(names))) + "}"


def _excluded(value: cst.BaseExpression) -> tuple[list[str], cst.BaseExpression | None] | None:
    """A filter this codemod wrote: (the names it excludes, the filter it wraps or None); else None."""
    if not isinstance(value, cst.Lambda) or len(value.params.params) != 2:
        return None
    fqn = value.params.params[1].name.value
    body, rest = value.body, None
    if isinstance(body, cst.BooleanOperation) and isinstance(body.operator, cst.And):
        body, rest = body.left, body.right
    if not (isinstance(body, cst.Comparison) and isinstance(body.left, cst.Name) and body.left.value == fqn
            and len(body.comparisons) == 1 and isinstance(body.comparisons[0].operator, cst.NotIn)
            and isinstance(body.comparisons[0].comparator, cst.Set)):
        return None
    names = []
    for element in body.comparisons[0].comparator.elements:
        if not isinstance(element.value, cst.SimpleString):
            return None
        names.append(element.value.evaluated_value)
    return names, rest


class ExcludeFromConversion(Codemod):
    """Add layers (by fully qualified name) to what the script's fp8 conversion call leaves out."""

    DESCRIPTION: ClassVar[str] = "leave named layers out of the script's fp8 conversion call (its module_filter_fn)"

    def __init__(self, fqns: Iterable[str]) -> None:
        self.fqns = tuple(sorted(set(fqns)))

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        module = cst.parse_module(source)
        target = the_one_call(
            module,
            lambda node: _callee(node) in CONVERSIONS or any(a.keyword is not None and a.keyword.value == KEYWORD for a in node.args),
            f"no fp8 conversion call ({', '.join(sorted(CONVERSIONS))}, or a call passing {KEYWORD}=) in {filename}",
            f"fp8 conversion calls in {filename}; which one converts the traced model is not known",
        )
        fqns = self.fqns

        def filter_for(old: cst.BaseExpression | None) -> cst.BaseExpression:
            names: list[str] = list(fqns)
            ours = _excluded(old) if old is not None else None
            if ours is not None:  # a filter written before: its names join, what it wraps stays wrapped
                names += ours[0]
                rest = cst.Module([]).code_for_node(ours[1]) if ours[1] is not None else None
            else:
                rest = f"({cst.Module([]).code_for_node(old)})(mod, fqn)" if old is not None else None
            text = f"lambda mod, fqn: fqn not in {_set_literal(names)}"
            return cst.parse_expression(text + (f" and {rest}" if rest else ""))

        new_source, line = with_keyword(module, target, KEYWORD, filter_for)
        return new_source, f"{_callee(target)}(...) at {filename}:{line}: {KEYWORD} leaves out {', '.join(fqns)}"
