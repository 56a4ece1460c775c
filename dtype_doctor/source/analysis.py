"""One LibCST analysis of the user's Python source, read by the lineage and by the patches.

The lineage's ``source`` line of a preprocess output (load/batch/preprocess.py) and the codemods
that patch the same function (fix/codemods) see the code through this module: one parse, one
dtype vocabulary, one answer to "which expressions build output ``k``" and "which casts set a
dtype". So the line a report names is the line the first patch attempt edits.

No torch import: the analysis reads source text only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

# ---------------------------------------------------------------------------------------
# dtype vocabulary

TORCH_DTYPES = {
    "float16": "float16", "half": "float16",
    "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64",
    "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64",
    "int32": "int32", "int": "int32",
    "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool",
}  # fmt: skip
NUMPY_DTYPES = {
    "float16": "float16", "half": "float16",
    "float32": "float32", "single": "float32",
    "float64": "float64", "double": "float64",
    "int64": "int64", "int32": "int32", "intc": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8",
}  # fmt: skip
STRING_DTYPES = {"float16", "float32", "float64", "bfloat16", "int64", "int32", "int16", "int8", "uint8"}
EXTRA_ALIASES = {"fp16": "float16", "fp32": "float32", "fp64": "float64", "bf16": "bfloat16"}
# Tensor methods that cast, and the method that casts to each dtype.
METHOD_DTYPES = {
    "half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16",
    "long": "int64", "int": "int32", "short": "int16", "char": "int8", "byte": "uint8",
}  # fmt: skip
DTYPE_METHODS = {v: k for k, v in METHOD_DTYPES.items()}
FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
HALF = frozenset({"float16", "bfloat16"})
INTEGER = frozenset({"int8", "int16", "int32", "int64", "uint8"})
CAST_METHODS = ("to", "type", "astype")

# A map function whose first parameter has one of these names is mapped with batched=True.
BATCHED_PARAM_NAMES = ("batch", "examples", "batched", "samples", "example_batch", "batch_examples")


def normalize_dtype(name: str) -> str:
    """``"torch.half"`` / ``"fp16"`` / ``"float16"`` → ``"float16"``; raises ValueError when unknown."""
    key = name.strip()
    for prefix in ("torch.", "np.", "numpy."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    canon = TORCH_DTYPES.get(key) or EXTRA_ALIASES.get(key)
    if canon is None:
        raise ValueError(f"unknown dtype {name!r}")
    return canon


def dtype_family(dtype: str) -> str:
    return "floating" if dtype in FLOATING else "integer" if dtype in INTEGER else dtype


def batched_by_params(params: Sequence[str]) -> bool:
    """Whether a map function taking `params` is mapped with batched=True (its first parameter says so)."""
    return bool(params) and params[0] in BATCHED_PARAM_NAMES


# ---------------------------------------------------------------------------------------
# The parse: metadata and lookups


class NotInSource(LookupError):
    """What was asked for is not in the source (no such function, or more than one)."""


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    collector = _Collector()
    node.visit(collector)
    return collector.nodes


def dotted(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


@dataclass
class Imports:
    torch: set[str] = field(default_factory=lambda: {"torch"})
    numpy: set[str] = field(default_factory=lambda: {"np", "numpy"})
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # `from torch import float16`
    top_level_torch: str | None = None  # a module-level name bound to torch, reusable anywhere

    @classmethod
    def of(cls, module: cst.Module, nodes: Sequence[cst.CSTNode]) -> Imports:
        imports = cls()
        top_level = {id(stmt) for line in module.body if isinstance(line, cst.SimpleStatementLine) for stmt in line.body}
        for node in nodes:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    full = dotted(alias.name)
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
                lib = {"torch": "torch", "numpy": "numpy"}.get(dotted(node.module) if node.module else "")
                if lib is None:
                    continue
                table = TORCH_DTYPES if lib == "torch" else NUMPY_DTYPES
                for alias in node.names:
                    name = alias.name.value if isinstance(alias.name, cst.Name) else None
                    local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
                    if name in table and local:
                        imports.names[local] = (lib, table[name])
        return imports


class SourceAnalysis:
    """One parsed file: positions, parents, scopes, the torch / numpy imports, its functions."""

    def __init__(self, source: str, filename: str):
        self.filename = filename
        self.wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._positions = self.wrapper.resolve(PositionProvider)
        self._parents = self.wrapper.resolve(ParentNodeProvider)
        self._scopes: Mapping[cst.CSTNode, Any] | None = None
        self.nodes = walk(self.module)
        self.imports = Imports.of(self.module, self.nodes)

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

    def function(self, qualname: str) -> cst.CSTNode:
        """The def (or `name = lambda ...`) called qualname ("func", "Class.method", or "main.preprocess" for a
        def inside a def: the names enclosing_function gives)."""
        *owners, name = qualname.split(".")
        found: list[cst.CSTNode] = []
        for node in self.nodes:
            if isinstance(node, cst.FunctionDef) and node.name.value == name:
                classes = [a.name.value for a in self.ancestors(node) if isinstance(a, (cst.ClassDef, cst.FunctionDef))]
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
            raise NotInSource(f"no function {qualname}() in {self.filename}")
        if len(found) > 1:
            lines = ", ".join(str(self.line(n)) for n in found)
            raise NotInSource(f"{len(found)} functions named {qualname} in {self.filename} (lines {lines}); ambiguous")
        return found[0]

    def enclosing_function(self, line: int) -> str | None:
        """The qualified name ("Class.method") of the innermost def around `line`; None at top level."""
        defs = [n for n in self.nodes if isinstance(n, cst.FunctionDef) and self.covers(n, line)]
        if not defs:
            return None
        inner = max(defs, key=self.line)
        owners = [a.name.value for a in self.ancestors(inner) if isinstance(a, (cst.ClassDef, cst.FunctionDef))]
        return ".".join([*reversed(owners), inner.name.value])

    def is_batched(self, fn: cst.CSTNode) -> bool:
        """Whether the loader maps `fn` with batched=True: its first parameter's name, or a
        module-level ``FUNC.batched = True`` (load_preprocess reads the same two signs)."""
        params = fn.params.posonly_params or fn.params.params if isinstance(fn, (cst.FunctionDef, cst.Lambda)) else ()
        if batched_by_params([p.name.value for p in params]):
            return True
        name = fn.name.value if isinstance(fn, cst.FunctionDef) else None
        for line in self.module.body:
            if not isinstance(line, cst.SimpleStatementLine):
                continue
            for stmt in line.body:
                if (
                    isinstance(stmt, cst.Assign)
                    and any(dotted(t.target) == f"{name}.batched" for t in stmt.targets)
                    and isinstance(stmt.value, cst.Name)
                    and stmt.value.value == "True"
                ):
                    return True
        return False

    def own_returns(self, fn: cst.CSTNode) -> list[cst.Return]:
        """The return statements of `fn` itself (with a value), not of functions nested in it."""
        out = []
        for node in walk(fn):
            if isinstance(node, cst.Return) and node.value is not None:
                owner = next((a for a in self.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
                if owner is fn:
                    out.append(node)
        return out


# ---------------------------------------------------------------------------------------
# Casts: the places that set a dtype


@dataclass(frozen=True)
class CastSite:
    """One place that sets a dtype: a dtype expression, or the name of a casting method."""

    node: cst.CSTNode  # what gets replaced: the dtype expression, or the method's Name
    kind: str  # "expr" | "method"
    lib: str  # torch | numpy | str | method
    dtype: str
    line: int


def dtype_of(expr: cst.CSTNode, imports: Imports) -> tuple[str, str] | None:
    """(library, canonical dtype) when expr names a dtype: torch.float16, np.int32, "float16"."""
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        base, attr = expr.value.value, expr.attr.value
        if base in imports.torch and attr in TORCH_DTYPES:
            return "torch", TORCH_DTYPES[attr]
        if base in imports.numpy and attr in NUMPY_DTYPES:
            return "numpy", NUMPY_DTYPES[attr]
        return None
    if isinstance(expr, cst.Name):
        return imports.names.get(expr.value)
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        if isinstance(value, str) and value in STRING_DTYPES:
            return "str", value
    return None


def cast_sites(src: SourceAnalysis, scope: cst.CSTNode) -> list[CastSite]:
    """Every cast in `scope`, in source order: ``.to(dtype)`` / ``.type`` / ``.astype``, any
    ``dtype=`` keyword, numpy's positional dtype, ``np.float16(x)``, ``.half()`` and the like."""
    sites: dict[int, CastSite] = {}
    imports = src.imports

    def add(node: cst.CSTNode, kind: str, lib: str, dtype: str) -> None:
        sites.setdefault(id(node), CastSite(node, kind, lib, dtype, src.line(node)))

    for node in walk(scope):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            module_ref = isinstance(func.value, cst.Name) and func.value.value in (imports.torch | imports.numpy)
            if attr in METHOD_DTYPES and not node.args and not module_ref:
                add(func.attr, "method", "method", METHOD_DTYPES[attr])
            if attr in CAST_METHODS and not module_ref:
                for arg in node.args:
                    if arg.keyword is None or arg.keyword.value == "dtype":
                        found = dtype_of(arg.value, imports)
                        if found:
                            add(arg.value, "expr", *found)
        numpy_call = isinstance(func, cst.Attribute) and dotted(func.value) in imports.numpy
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "dtype":
                found = dtype_of(arg.value, imports)
                if found:
                    add(arg.value, "expr", *found)
            elif arg.keyword is None and not arg.star and numpy_call:  # np.asarray(x, np.int32)
                found = dtype_of(arg.value, imports)
                if found and found[0] in ("numpy", "str"):
                    add(arg.value, "expr", *found)
        found = dtype_of(func, imports)
        if found and found[0] == "numpy":  # np.float16(x)
            add(func, "expr", *found)
    return sorted(sites.values(), key=lambda s: (s.line, src.span(s.node).start.column))


# ---------------------------------------------------------------------------------------
# Outputs: the expressions that build the value under a key


def _key_target(target: cst.BaseExpression, is_key: Callable[[str], bool]) -> bool:
    if isinstance(target, cst.Name):
        return is_key(target.value)
    if isinstance(target, cst.Attribute):
        return is_key(target.attr.value)
    return _subscript_key(target, is_key)


def _subscript_key(target: cst.BaseExpression, is_key: Callable[[str], bool]) -> bool:
    """`out["k"]` with a key `is_key` accepts."""
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
            return isinstance(key, str) and is_key(key)
    return False


def _appended(node: cst.CSTNode, receiver: Callable[[cst.BaseExpression], bool]) -> list[cst.BaseExpression]:
    """The values `x.append(v)` / `.extend` / `.insert` adds to a receiver `receiver` accepts."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("append", "extend", "insert")
        and receiver(node.func.value)
    ):
        return [a.value for a in node.args]
    return []


def values_for(scope: cst.CSTNode, is_key: Callable[[str], bool]) -> list[cst.BaseExpression]:
    """Expressions whose value ends up under a key `is_key` accepts: `k = …`, `out["k"] = …`,
    `out["k"].append(…)`, `{"k": …}`, `k=…`, and the assignments of the local names those use."""
    nodes = walk(scope)
    values: list[cst.BaseExpression] = []
    for node in nodes:
        if isinstance(node, cst.Assign) and any(_key_target(t.target, is_key) for t in node.targets):
            values.append(node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None and _key_target(node.target, is_key):
            values.append(node.value)
        elif isinstance(node, cst.Dict):
            for el in node.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                    key = el.key.evaluated_value
                    if isinstance(key, str) and is_key(key):
                        values.append(el.value)
        elif isinstance(node, cst.Arg) and node.keyword is not None and is_key(node.keyword.value):
            values.append(node.value)
        else:
            values += _appended(node, lambda r: _subscript_key(r, is_key))
    # `y = np.array(..., dtype=np.int32); return {"labels": y}`: follow names to their assignments,
    # and a list built with `y.append(…)` to what is appended.
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
            else:
                values += _appended(node, lambda r: isinstance(r, cst.Name) and r.value in names)
    return values


def _is_label_name(name: str) -> bool:
    return (name in {"label", "labels", "label_ids"} or name.endswith(("_label", "_labels"))) and not name.startswith(
        "num_"
    )


def label_values(scope: cst.CSTNode) -> list[cst.BaseExpression]:
    """Expressions whose value ends up as labels: `labels = …`, `{"labels": …}`, `labels=…`."""
    return values_for(scope, _is_label_name)


def key_of(expr: cst.BaseExpression | None) -> str | None:
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


# ---------------------------------------------------------------------------------------
# The lineage's view: which line gives an output its dtype


class FunctionSource:
    """The user's preprocess function as the lineage reads it: for each output, the line that
    gives it its dtype. ``None`` lines when the file cannot be read or parsed."""

    def __init__(self, path: str | Path, function: str):
        try:
            self.src: SourceAnalysis | None = SourceAnalysis(read_source(Path(path)), Path(path).name)
            self.fn: cst.CSTNode | None = self.src.function(function)
        except (OSError, UnicodeDecodeError, SyntaxError, cst.ParserSyntaxError, NotInSource):
            self.src = self.fn = None

    def dtype_line(self, key: str, dtype: str | None = None) -> int | None:
        """The line that makes output `key` the `dtype` it has (None: not known).

        First a cast to `dtype` among the expressions that build the output (the last one;
        without `dtype`, the last cast); else the last expression that makes the value afresh
        (``ids = np.full(8, np.nan)``, not ``ids = np.nan_to_num(ids)`` after it); else the
        function's last return, where the value leaves it.
        """
        src, fn = self.src, self.fn
        if src is None or fn is None:
            return None
        values = values_for(fn, lambda name: name == key)
        sites = sorted({id(s.node): s for v in values for s in cast_sites(src, v)}.values(), key=lambda s: s.line)
        matching = [s for s in sites if dtype is None or s.dtype == dtype]
        if matching:
            return matching[-1].line
        makers = [v for v in values if not isinstance(v, cst.Name) and not _updates_itself(src, v)]
        if makers:
            return max(src.line(v) for v in makers)
        returns = src.own_returns(fn)
        return src.line(returns[-1]) if returns else src.line(fn)


def _updates_itself(src: SourceAnalysis, value: cst.BaseExpression) -> bool:
    """`ids = np.nan_to_num(ids)`: a value computed from the name it is assigned to keeps its dtype's origin."""
    stmt = src.parent(value)
    if not isinstance(stmt, cst.Assign):
        return False
    targets = {t.target.value for t in stmt.targets if isinstance(t.target, cst.Name)}
    return any(isinstance(n, cst.Name) and n.value in targets for n in walk(value))


def read_source(path: Path) -> str:
    """A Python file's text as written: its declared encoding, its own line endings."""
    import tokenize

    data = Path(path).read_bytes()
    encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
    if encoding == "utf-8-sig":  # keep the BOM out of the text, like every editor does
        encoding = "utf-8"
        data = data.removeprefix(b"\xef\xbb\xbf")
    return data.decode(encoding)
