"""Where the user's code last bound a name: the line a dropped move belongs on.

A batch the script forgot to move, or a model it never moved, reaches the model call by a plain
Python name (`output = model(data)`). No torch op runs where that name was bound
(`data, target = data, target.to(device)`, `model = Net()`), so the lineage cannot see the line;
the source can. Given a call's line, this module names, for each argument and for the called name,
the nearest statement before the call in the same function (else the module) that bound it: an
assignment, a for-loop target, a `with ... as`, a walrus. A name that is the function's own
parameter is answered as the caller's argument (`train(model, ...)` → `model = Net()` in `main`).

Standard-library `ast` only, one parse per file (cached on the file's modification time).
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Module

# The methods through which a script runs a model's forward: its own, and a VAE's encode/decode
# (`latents = vae.encode(pixels).latent_dist.sample()`, diffusers' training examples).
FORWARD_ENTRIES = frozenset({"forward", "encode", "decode"})


@dataclass(frozen=True, slots=True)
class CallSite:
    """A call in the user's source, by its line: the called name's root and each argument's name
    (positional by index, keywords by keyword); None where an argument is not a plain name."""

    callee: str | None
    positional: tuple[str | None, ...]
    keywords: tuple[tuple[str, str | None], ...]
    unpacked: str | None = None  # `model(**batch)`: the plain name unpacked into keywords


def call_at(path: str, line: int, callee: str | None = None) -> CallSite | None:
    """The call on `line` of `path` whose function is a plain name or `name.attr` chain (`callee`, when
    given, must be that name's last part); the innermost such call whose function is a variable."""
    tree = _parsed(path)
    if tree is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            name = _dotted(node.func)
            if name is None or (callee is not None and name.rsplit(".", 1)[-1] != callee):
                continue
            if found is None or _within(node, found):
                found = node
    if found is None:
        return None
    unpacked = [_name(k.value) for k in found.keywords if k.arg is None]
    return CallSite(_dotted(found.func), tuple(_name(a) for a in found.args),
                    tuple((k.arg, _name(k.value)) for k in found.keywords if k.arg is not None),
                    unpacked[0] if len(unpacked) == 1 else None)


def last_binding(path: str, line: int, name: str) -> int | None:
    """The line of the nearest statement before `line` that bound `name` in the function holding
    `line` (the module's statements when the function never binds it); None when none did, or
    when the name is the function's parameter (the caller's argument is the answer then)."""
    tree = _parsed(path)
    if tree is None:
        return None
    scope = _scope_at(tree, line)
    if not isinstance(scope, ast.Module) and name in _parameters(scope):
        return None
    for candidate in (scope, tree) if scope is not tree else (tree,):
        lines = [n for n in _bindings(candidate, name) if n < line]
        if lines:
            return max(lines)
    return None


def unpacked_from(path: str, line: int, name: str) -> str | None:
    """When the statement on `line` binds `name` by unpacking or renaming another plain name
    (`x, y = batch`, `inputs = batch`): that name, whose own binding is where a move belongs."""
    tree = _parsed(path)
    if tree is None:
        return None
    for node in _own_nodes(_scope_at(tree, line)):
        if isinstance(node, ast.Assign) and node.lineno == line and isinstance(node.value, ast.Name):
            if node.value.id != name and any(isinstance(n, ast.Name) and n.id == name for t in node.targets for n in ast.walk(t)):
                return node.value.id
    return None


def autocast_entered(path: str, line: int) -> int | None:
    """The line that made the autocast a `with` around `line` entered: the `with torch.autocast(...)`
    itself, or the assignment of the name it entered (`ctx = nullcontext() if cpu else torch.amp.autocast(...)`
    ... `with ctx:`); the innermost such `with`; None when no `with` around the line enters one."""
    tree = _parsed(path)
    if tree is None:
        return None
    withs = [n for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith)) and n.lineno <= line <= (n.end_lineno or n.lineno)]
    for node in sorted(withs, key=lambda n: n.lineno, reverse=True):
        for item in node.items:
            if _makes_autocast(item.context_expr):
                return item.context_expr.lineno
            if isinstance(item.context_expr, ast.Name):
                made = last_binding(path, node.lineno, item.context_expr.id)
                value = _assigned_value(tree, made) if made is not None else None
                if value is not None and _makes_autocast(value):
                    return made
    return None


def _makes_autocast(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and (_dotted(n.func) or "").rpartition(".")[2] == "autocast" for n in ast.walk(node))


def _assigned_value(tree: ast.Module, line: int) -> ast.expr | None:
    return next((n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == line), None)


def assigned_at(path: str, line: int) -> bool:
    """Whether the statement on `line` is an assignment (not a loop's or a `with`'s target)."""
    tree = _parsed(path)
    return tree is not None and any(isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno == line
                                    for n in _own_nodes(_scope_at(tree, line)))


def returned_at(path: str, line: int) -> int | None:
    """When `line` assigns a plain name inside a function that then hands it back (`data = data.view(bsz,
    -1).t().contiguous()` ... `return data`): the line of that `return`, where the function lets the tensor
    go as it is; None otherwise."""
    tree = _parsed(path)
    scope = _scope_at(tree, line) if tree is not None else None
    if scope is None or isinstance(scope, ast.Module):
        return None
    nodes = list(_own_nodes(scope))
    names = {t.id for n in nodes if isinstance(n, ast.Assign) and n.lineno == line for t in n.targets if isinstance(t, ast.Name)}
    returns = sorted((n.lineno for n in nodes if isinstance(n, ast.Return) and n.lineno > line
                      and isinstance(n.value, ast.Name) and n.value.id in names))
    return returns[0] if len(names) == 1 and returns else None


def parameter_index(path: str, line: int, name: str) -> tuple[str, int | None] | None:
    """When `name` is a parameter of the function holding `line`: (the function's name, its
    positional index or None for keyword-only)."""
    tree = _parsed(path)
    scope = _scope_at(tree, line) if tree is not None else None
    if scope is None or isinstance(scope, ast.Module):
        return None
    params = _parameters(scope)
    if name not in params:
        return None
    positional = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    return scope.name, positional.index(name) if name in positional else None


def same_function(path: str, a: int, b: int) -> bool:
    """Whether lines `a` and `b` of `path` lie in the same function (or both at the module's level)."""
    tree = _parsed(path)
    return tree is not None and _scope_at(tree, a) is _scope_at(tree, b)


# ------------------------------------------------------------------ the parse


@functools.lru_cache(maxsize=64)
def _parsed_at(path: str, mtime: float) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _parsed(path: str) -> ast.Module | None:
    try:
        return _parsed_at(path, os.stat(path).st_mtime)
    except OSError:
        return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _within(inner: ast.AST, outer: ast.AST) -> bool:
    return any(n is inner for n in ast.walk(outer)) and inner is not outer


def _scope_at(tree: ast.Module, line: int) -> _Scope:
    best: _Scope = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is tree or node.lineno >= best.lineno:
                best = node
    return best


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]
    return {x.arg for x in names}


def _own_nodes(scope: _Scope) -> Iterator[ast.AST]:
    """The scope's nodes, not those of the functions and classes it defines."""
    stack: list[ast.AST] = list(scope.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.AST) -> Sequence[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.For, ast.AsyncFor, ast.comprehension)):
        return [node.target]
    if isinstance(node, ast.withitem):
        return [node.optional_vars] if node.optional_vars is not None else []
    return []


def _bindings(scope: _Scope, name: str) -> Iterator[int]:
    for node in _own_nodes(scope):
        if isinstance(node, ast.comprehension):
            continue  # a comprehension's variable is its own
        for target in _targets(node):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
                yield getattr(node, "lineno", None) or target.lineno
