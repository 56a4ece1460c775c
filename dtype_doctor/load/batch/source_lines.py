"""Which line of the user's preprocess function gives each output its dtype (the report's
`source`), read from the function's AST."""

from __future__ import annotations

import ast

from dtype_doctor.load.batch.state import PreprocessFn

_CAST_ATTRS = {"half", "bfloat16", "float", "double", "to", "astype", "type", "long", "int", "short"}
_DTYPE_NAMES = {
    "float16", "half", "bfloat16", "float32", "float64", "double", "int8", "int16", "int32", "int64",
    "uint8", "long", "int", "short",
}


def _is_cast(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _CAST_ATTRS:
            if sub.func.attr in ("to", "type", "astype"):
                # .to("cuda") is a transfer, not a cast: need a dtype somewhere in the args
                if any(
                    isinstance(a, ast.Attribute) and a.attr in _DTYPE_NAMES
                    or isinstance(a, ast.Constant) and a.value in _DTYPE_NAMES
                    or isinstance(a, ast.Name) and a.id in _DTYPE_NAMES
                    for arg in list(sub.args) + [k.value for k in sub.keywords]
                    for a in ast.walk(arg)
                ):
                    return True
            else:
                return True
        if isinstance(sub, ast.keyword) and sub.arg == "dtype":
            return True
    return False


def source_lines(pre: PreprocessFn) -> tuple[dict[str, int], int | None]:
    """(output key → the line that gives it its dtype, fallback: the first cast or the return).

    Best effort, from the function's AST: a key's candidates are ``out["k"] = …``,
    ``out["k"].append(…)`` / ``.extend(…)``, ``{"k": …}`` and ``dict(k=…)``; the last candidate
    that casts (directly, or through a local name assigned with a cast before it) wins, else the
    last candidate.
    """
    try:
        tree = ast.parse(pre.path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}, None
    fdef = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == pre.name),
        None,
    )
    if fdef is None:
        return {}, None
    cands: dict[str, list[ast.expr]] = {}  # output key → expressions that give it
    assigns: dict[str, list[ast.stmt]] = {}  # local name → its assignments
    casts: list[int] = []
    returns: list[int] = []

    def const_key(node: ast.AST) -> str | None:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return node.slice.value
        return None

    for node in ast.walk(fdef):
        if isinstance(node, ast.Return):
            returns.append(node.lineno)
            if node.value is not None and _is_cast(node.value):
                casts.append(node.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                key = const_key(t)
                if key is not None:
                    cands.setdefault(key, []).append(node.value)
                if isinstance(t, ast.Name):
                    assigns.setdefault(t.id, []).append(node)
            if _is_cast(node.value):
                casts.append(node.lineno)
        if isinstance(node, ast.Expr) and _is_cast(node.value):
            casts.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend"):
            key = const_key(node.func.value)
            if key is not None and node.args:
                cands.setdefault(key, []).append(node.args[0])
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    cands.setdefault(k.value, []).append(v)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            for kw in node.keywords:
                if kw.arg:
                    cands.setdefault(kw.arg, []).append(kw.value)

    def cast_line(expr: ast.expr) -> int | None:
        if _is_cast(expr):
            return expr.lineno
        # {"pixel_values": tensor} where `tensor = tensor.to(torch.float16)` came before
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        lines = [
            a.lineno for n in names for a in assigns.get(n, [])
            if a.lineno <= expr.lineno and getattr(a, "value", None) is not None and _is_cast(a.value)  # type: ignore[arg-type]
        ]
        return max(lines) if lines else None

    keys: dict[str, int] = {}
    for key, exprs in cands.items():
        exprs = sorted(exprs, key=lambda e: e.lineno)
        cast_lines = [ln for ln in (cast_line(e) for e in exprs) if ln is not None]
        keys[key] = cast_lines[-1] if cast_lines else exprs[-1].lineno
    fallback = min(casts) if casts else (max(returns) if returns else fdef.lineno)
    return keys, fallback
