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


_OPTIMIZER_WORDS = ("optim", "Adam", "SGD", "RMSprop", "Adagrad", "Lion", "configure_optimizers")


class AddGradScaler(Codemod):
    """A script that trains under float16 autocast with no GradScaler gets one: made after its optimizer
    (`scaler = torch.amp.GradScaler("cuda")`), `loss.backward()` → `scaler.scale(loss).backward()`,
    `opt.step()` → `scaler.step(opt)` and `scaler.update()`, and `scaler.unscale_(opt)` before a
    gradient clip there. Skipped unless the file has one backward and one step of one optimizer."""

    DESCRIPTION: ClassVar[str] = "Scale the float16 loss with a GradScaler around the script's backward and optimizer step."

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        module = cst.parse_module(source)
        finder = _LoopFinder()
        module.visit(finder)
        if finder.scalers:
            raise _Skip(f"{filename} makes a GradScaler already")
        if len(finder.backwards) != 1 or len(finder.steps) != 1:
            raise _Skip(f"{filename}: {len(finder.backwards)} loss.backward() and {len(finder.steps)} optimizer.step() "
                        "statements; one of each is needed to know where the scaler goes")
        opt = finder.steps[0][1]
        made = [s for s in finder.assigns if s[1] == opt]
        if len(made) != 1:
            raise _Skip(f"{filename}: where the optimizer `{opt}` is made is not one line")
        edit = _AddScaler(finder.backwards[0], finder.steps[0][0], made[0][0], opt, finder.clips)
        return module.visit(edit).code, f"{filename}: a GradScaler after `{opt} = ...`, scaling the backward and stepping `{opt}`"


class _LoopFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.backwards: list[cst.SimpleStatementLine] = []
        self.steps: list[tuple[cst.SimpleStatementLine, str]] = []
        self.assigns: list[tuple[cst.SimpleStatementLine, str]] = []
        self.clips: list[cst.SimpleStatementLine] = []
        self.scalers = 0

    def visit_Call(self, node: cst.Call) -> None:
        self.scalers += _is_scaler(node)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1:
            return
        stmt = node.body[0]
        if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0].target, cst.Name):
            if isinstance(stmt.value, cst.Call) and any(w in (get_full_name_for_node(stmt.value.func) or "") for w in _OPTIMIZER_WORDS):
                self.assigns.append((node, stmt.targets[0].target.value))
        call = stmt.value if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call) else None
        if call is None or not isinstance(call.func, cst.Attribute):
            return
        method = call.func.attr.value
        if method == "backward" and not isinstance(call.func.value, cst.Call):
            self.backwards.append(node)
        elif method == "step" and not call.args and isinstance(call.func.value, cst.Name):
            self.steps.append((node, call.func.value.value))
        elif method in ("clip_grad_norm_", "clip_grad_value_"):
            self.clips.append(node)


class _AddScaler(cst.CSTTransformer):
    def __init__(self, backward: cst.SimpleStatementLine, step: cst.SimpleStatementLine, made: cst.SimpleStatementLine,
                 opt: str, clips: list[cst.SimpleStatementLine]) -> None:
        self.backward, self.step, self.made, self.opt, self.clips = backward, step, made, opt, clips

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):  # type: ignore[override]
        if original is self.backward:
            call = updated.body[0].value  # type: ignore[union-attr]
            loss = cst.Module([]).code_for_node(call.func.value)
            return updated.with_changes(body=[cst.Expr(cst.parse_expression(f"scaler.scale({loss}).backward()"))])
        if original is self.step:
            return cst.FlattenSentinel([
                updated.with_changes(body=[cst.Expr(cst.parse_expression(f"scaler.step({self.opt})"))]),
                cst.SimpleStatementLine([cst.Expr(cst.parse_expression("scaler.update()"))]),
            ])
        if original in self.clips:
            return cst.FlattenSentinel([
                updated.with_changes(body=[cst.Expr(cst.parse_expression(f"scaler.unscale_({self.opt})"))]), updated,
            ])
        if original is self.made:
            return cst.FlattenSentinel([
                updated, cst.SimpleStatementLine([cst.parse_statement('scaler = torch.amp.GradScaler("cuda")').body[0]]),
            ])
        return updated
