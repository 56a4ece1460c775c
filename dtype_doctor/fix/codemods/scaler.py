"""Loss scaling switched on: EnableGradScaler rewrites a script's disabled ``GradScaler(enabled=False)``
(DD403: float16 autocast training with no loss scaling) so the scaler the script already calls
(``scaler.scale(loss).backward()``, ``scaler.step(opt)``, ``scaler.update()``) scales the loss.

The flag becomes the one the script's own float16 choice decides where the file says it: with
the autocast's dtype held in a name the file assigns before the scaler (nanoGPT's ``ptdtype``),
``enabled=(ptdtype == torch.float16)``, so the scaler stays off in the script's bfloat16 and
float32 modes; otherwise ``enabled=True``. A scaler enabled by an expression (not the literal
False) is the script's own decision and is left as it is.
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
from libcst.helpers import get_full_name_for_node

from dtype_doctor.fix.codemods.base import Codemod, _Skip


def _is_scaler(call: cst.Call) -> bool:
    name = get_full_name_for_node(call.func) or ""
    return name.split(".")[-1] in ("GradScaler", "ShardedGradScaler")


def _autocast_dtype_name(module: cst.Module, before: int, positions: dict) -> str | None:
    """The name an autocast call's `dtype=` holds in this file (`ptdtype`), when the file assigns
    that name at top level before line `before`; None otherwise."""
    names: list[str] = []
    assigned: set[str] = set()

    class Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if (get_full_name_for_node(node.func) or "").split(".")[-1] != "autocast":
                return
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value == "dtype" and isinstance(arg.value, cst.Name):
                    names.append(arg.value.value)

    module.visit(Find())
    for stmt in module.body:
        if positions[stmt].start.line >= before or not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                assigned.update(t.target.value for t in small.targets if isinstance(t.target, cst.Name))
    known = [n for n in dict.fromkeys(names) if n in assigned]
    return known[0] if len(known) == 1 else None


def _imports_torch(module: cst.Module) -> bool:
    return any(isinstance(s, cst.SimpleStatementLine) and any(
        isinstance(i, cst.Import) and any(get_full_name_for_node(a.name) == "torch" and a.asname is None for a in i.names)
        for i in s.body) for s in module.body)


class EnableGradScaler(Codemod):
    """The file's GradScaler made with `enabled=False` (at `lines`, else the only one) switched on."""

    DESCRIPTION: ClassVar[str] = "Enable the script's disabled GradScaler, so the float16 loss is scaled."

    def __init__(self, lines: list[int] | None = None) -> None:
        self.lines = list(lines or [])

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        from libcst.metadata import MetadataWrapper, PositionProvider

        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        positions = wrapper.resolve(PositionProvider)
        off: list[tuple[cst.Call, int]] = []

        class Find(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> None:
                if _is_scaler(node) and any(a.keyword is not None and a.keyword.value == "enabled"
                                            and isinstance(a.value, cst.Name) and a.value.value == "False" for a in node.args):
                    off.append((node, positions[node].start.line))

        wrapper.module.visit(Find())
        chosen = [(n, line) for n, line in off if not self.lines or line in self.lines]
        if len(chosen) != 1:
            raise _Skip(f"{'no' if not chosen else 'more than one'} GradScaler(enabled=False) "
                        f"{'at line ' + ', '.join(map(str, self.lines)) if self.lines else ''} in {filename}".replace("  ", " "))
        target, line = chosen[0]
        dtype = _autocast_dtype_name(wrapper.module, line, positions)
        flag = cst.parse_expression(f"({dtype} == torch.float16)" if dtype and _imports_torch(wrapper.module) else "True")

        class Edit(cst.CSTTransformer):
            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
                if original is not target:
                    return updated
                args = [a.with_changes(value=flag) if a.keyword is not None and a.keyword.value == "enabled" else a
                        for a in updated.args]
                return updated.with_changes(args=args)

        new = wrapper.module.visit(Edit())
        said = cst.Module([]).code_for_node(flag)
        return new.code, f"{filename}:{line}: GradScaler(enabled=False) → enabled={said}"
