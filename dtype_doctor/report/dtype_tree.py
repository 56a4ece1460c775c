"""The model's modules whose parameters are off the majority dtype, as a short tree.

A big model has thousands of modules and almost all of them agree; the reader needs the
few that do not, with just enough ancestors to find them. So the tree keeps only those,
folds single-child chains into one dotted label, and merges ModuleList entries
(`block.0`, `block.1`, …) whose subtrees look the same into one `block.{0-23}` node.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from dtype_doctor.records import FLOATING, ModelInfo, StateTensor, main_dtype_of


@dataclass(frozen=True, slots=True)
class DtypeNode:
    label: str  # dotted path relative to the node shown above it; "" for the model
    module_type: str  # class name, "Parameter" for a single parameter
    dtypes: tuple[str, ...]  # the off-majority dtypes at or below this node
    params: int  # parameter tensors at or below this node
    collapsed: bool  # every parameter below is off the majority: children not shown
    kept_fp32: bool = False  # the model declares it fp32 (_keep_in_fp32_modules)
    children: tuple["DtypeNode", ...] = ()
    merged: int = 1  # sibling modules this node stands for

    def leaves(self) -> int:
        if not self.children:
            return self.merged
        return sum(c.leaves() for c in self.children)


@dataclass(frozen=True, slots=True)
class DtypeTree:
    majority: str
    params: int  # floating parameter tensors in the model
    off_majority: int  # of which not in the majority dtype
    root: DtypeNode


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _ancestors(name: str) -> list[str]:
    """`a.b.c` → ["", "a", "a.b", "a.b.c"]."""
    out = [""]
    if name:
        parts = name.split(".")
        out += [".".join(parts[: i + 1]) for i in range(len(parts))]
    return out


def _kept_fp32(name: str, keep: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return any(k in parts or name.endswith(k) for k in keep)


def majority_dtype(params: tuple[StateTensor, ...]) -> str | None:
    """The floating dtype holding the most parameter elements."""
    return main_dtype_of((p.dtype, math.prod(p.shape) if p.shape else 1) for p in params)


@dataclass(frozen=True)
class _Counts:
    """The model's floating parameters counted per module (dotted name, "" the root): its
    children, its parameters (its own and below) on and off the majority dtype, its own off it."""

    children: dict[str, set[str]]
    on_major: Counter[str]
    off_major: dict[str, Counter[str]]
    total: Counter[str]
    direct_off: dict[str, list[StateTensor]]


def _counts(params: tuple[StateTensor, ...], names: Iterable[str], majority: str) -> _Counts:
    children: dict[str, set[str]] = defaultdict(set)
    on_major: Counter[str] = Counter()
    off_major: dict[str, Counter[str]] = defaultdict(Counter)
    total: Counter[str] = Counter()
    direct_off: dict[str, list[StateTensor]] = defaultdict(list)

    for name in names:
        for a in _ancestors(name)[1:]:
            children[_parent(a)].add(a)
    for p in params:
        owner = _parent(p.name)
        for a in _ancestors(owner):
            if a:
                children[_parent(a)].add(a)
            total[a] += 1
            if p.dtype == majority:
                on_major[a] += 1
            else:
                off_major[a][p.dtype] += 1
        if p.dtype != majority:
            direct_off[owner].append(p)
    return _Counts(children, on_major, off_major, total, direct_off)


def dtype_tree(model: ModelInfo) -> DtypeTree | None:
    """The tree of off-majority modules, or None when every floating parameter agrees."""
    params = tuple(p for p in model.parameters if p.dtype in FLOATING)
    majority = majority_dtype(params)
    if majority is None or all(p.dtype == majority for p in params):
        return None

    order = {name: i for i, (name, _) in enumerate(model.module_types)}
    types = dict(model.module_types)
    counts = _counts(params, types, majority)
    children, on_major, off_major, total, direct_off = (counts.children, counts.on_major, counts.off_major, counts.total,
                                                        counts.direct_off)

    def sort_key(name: str) -> tuple[int, str]:
        return (order.get(name, len(order)), name)

    def build(name: str, shown_parent: str) -> DtypeNode | None:
        if not off_major.get(name):
            return None
        label = name[len(shown_parent) + 1 :] if shown_parent else name
        dtypes = tuple(sorted(off_major[name]))
        kept = _kept_fp32(name, model.keep_in_fp32_modules) if name else False
        if not on_major[name]:
            return DtypeNode(label, types.get(name, ""), dtypes, total[name], collapsed=True, kept_fp32=kept)
        # Mixed: a parameter of this module itself, or a child, is off the majority.
        own = [
            DtypeNode(p.name.rpartition(".")[2], "Parameter", (p.dtype,), 1, collapsed=True, kept_fp32=kept)
            for p in direct_off.get(name, ())
        ]
        kids = [build(c, name) for c in sorted(children.get(name, ()), key=sort_key)]
        shown = own + _merge_siblings([k for k in kids if k is not None])
        if name and len(shown) == 1 and not own:
            # A chain of single children reads better as one dotted path.
            return build_chain(shown[0], label)
        return DtypeNode(label, types.get(name, ""), dtypes, total[name], False, kept, tuple(shown))

    def build_chain(child: DtypeNode, prefix: str) -> DtypeNode:
        return DtypeNode(
            f"{prefix}.{child.label}" if prefix else child.label,
            child.module_type,
            child.dtypes,
            child.params,
            child.collapsed,
            child.kept_fp32,
            child.children,
            child.merged,
        )

    root = build("", "")
    assert root is not None  # some parameter is off the majority
    off = sum(1 for p in params if p.dtype != majority)
    return DtypeTree(majority, len(params), off, root)


def _shape(node: DtypeNode) -> tuple:
    """What makes two ModuleList entries look the same, ignoring their index."""
    return (
        node.label.partition(".")[2],
        node.module_type,
        node.dtypes,
        node.params,
        node.collapsed,
        node.kept_fp32,
        tuple(_shape(c) for c in node.children),
    )


def _merge_siblings(nodes: list[DtypeNode]) -> list[DtypeNode]:
    """`0.wo`, `1.wo`, … `23.wo` with equal subtrees → one `{0-23}.wo` node."""
    groups: dict[tuple, list[DtypeNode]] = {}
    out: list[DtypeNode | tuple] = []
    for n in nodes:
        head = n.label.partition(".")[0]
        if not head.isdigit():
            out.append(n)
            continue
        key = _shape(n)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(n)
    merged: list[DtypeNode] = []
    for item in out:
        if isinstance(item, DtypeNode):
            merged.append(item)
            continue
        group = groups[item]
        if len(group) == 1:
            merged.append(group[0])
            continue
        first = group[0]
        rest = first.label.partition(".")[2]
        indices = _index_range([int(n.label.partition(".")[0]) for n in group])
        label = f"{{{indices}}}" + (f".{rest}" if rest else "")
        merged.append(
            DtypeNode(
                label,
                first.module_type,
                first.dtypes,
                sum(n.params for n in group),
                first.collapsed,
                first.kept_fp32,
                first.children,
                sum(n.merged for n in group),
            )
        )
    return merged


def _index_range(indices: list[int]) -> str:
    """[0, 1, 2, 5] → `0-2,5`."""
    indices = sorted(indices)
    spans: list[str] = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(spans)
