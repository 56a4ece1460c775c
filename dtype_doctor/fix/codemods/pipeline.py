"""A script's diffusers pipeline set-up: SetUpPipeline adds lines after the pipeline is loaded and
cast, before its first call (`pipe.vae.to(torch.float32)` after `pipe = ...from_pretrained(...)`)."""

from __future__ import annotations

import ast

from dtype_doctor.fix.codemods.base import Codemod, _Skip


def _makes_pipeline(value: ast.expr) -> bool:
    """`X.from_pretrained(...)` (chained `.to(...)` allowed) or `XPipeline(...)` where X names a pipeline."""
    for node in ast.walk(value):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        owner = func.value if isinstance(func, ast.Attribute) and func.attr in ("from_pretrained", "from_single_file") else func
        name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
        if "Pipeline" in name:
            return True
    return False


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node))


class SetUpPipeline(Codemod):
    DESCRIPTION = "Add lines to a diffusers pipeline's set-up: after it is loaded and cast, before its first call."

    def __init__(self, lines: tuple[str, ...]) -> None:
        self.lines = lines

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        tree = ast.parse(source, filename)
        loads = [(body, i, stmt) for body in _bodies(tree) for i, stmt in enumerate(body)
                 if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                 and _makes_pipeline(stmt.value)]
        if not loads:
            raise _Skip(f"no pipeline is loaded in {filename} (X.from_pretrained(...) assigned to a name)")
        if len({id(body) for body, _, _ in loads}) > 1 or len({s.targets[0].id for _, _, s in loads}) > 1:  # type: ignore[attr-defined]
            raise _Skip(f"{filename} loads pipelines in more than one place; which one to fix is not clear")
        body, i, stmt = loads[-1]
        pipe = stmt.targets[0].id  # type: ignore[attr-defined]
        text = [line.format(pipe=pipe) for line in self.lines]
        if all(t.strip() in source for t in text):
            raise _Skip(f"{filename} already has these lines")
        # After the set-up that follows the load (a cast, .to(device)), right before the statement that calls it.
        calling = next((j for j in range(i + 1, len(body)) if _calls(body[j], pipe)), len(body))
        lines = source.splitlines(keepends=True)
        at = body[calling - 1].end_lineno
        indent = " " * stmt.col_offset
        added = [indent + t + "\n" for t in text]
        lines[at:at] = added
        new = "".join(lines)
        if not any(isinstance(n, ast.Import) and any(a.name == "torch" for a in n.names) for n in ast.walk(tree)):
            new = _import_torch(new, tree)
        return new, f"added {len(added)} line(s) to the set-up of {pipe} in {filename}"


def _bodies(tree: ast.AST) -> list[list[ast.stmt]]:
    """Every statement list of the module (its own, and each function's, loop's or block's)."""
    return [getattr(n, f) for n in ast.walk(tree) for f in ("body", "orelse", "finalbody")
            if isinstance(getattr(n, f, None), list) and getattr(n, f) and isinstance(getattr(n, f)[0], ast.stmt)]


def _import_torch(source: str, tree: ast.Module) -> str:
    """`import torch` after the module's last top-level import (or its docstring)."""
    lines = source.splitlines(keepends=True)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    docstring = tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(getattr(tree.body[0], "value", None), ast.Constant)
    at = imports[-1].end_lineno if imports else (tree.body[0].end_lineno if docstring else 0)
    lines[at:at] = ["import torch\n"]  # type: ignore[index]
    return "".join(lines)
