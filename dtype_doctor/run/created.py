"""Findings on tensors the user's own lines made or last handled, pointed at those lines.

A tensor made in the model's forward without device= reaches the rules as "created:OP@MODULE"
(the aten op the recorder saw); the run knows which line of the user's called the factory, so
the finding names it as the user wrote it: "torch.arange at model.py:96". A pipeline tensor on
the wrong device is named at the last line of the user's that handled it before the step took
it (`y.pin_memory()`), where the dropped `.to(device)` belongs, not where it was first made.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping, Sequence

from dtype_doctor.fix.strategies.base import factory_of
from dtype_doctor.records import Finding, Remedy, SourceLoc

def with_creation_source(finding: Finding, created: Mapping[str, Sequence[SourceLoc]], model: Any) -> Finding:
    origins = [t.origin for t in finding.tensors if t.origin and t.origin.startswith("created:")]
    if not origins:
        return _with_attribute_source(finding, model)
    where: dict[str, SourceLoc] = {}
    for origin in dict.fromkeys(origins):
        factory, module = factory_of(origin)
        site = _site(created.get(factory, ()), model, module)
        if site is not None:
            where[origin] = site
    if not where:
        return finding
    message = finding.message
    for origin, site in where.items():
        factory, _ = factory_of(origin)
        op = origin.removeprefix("created:").partition("@")[0]
        base = op.removeprefix("aten.").split(".")[0]
        message = message.replace(f"a tensor from {base}", f"torch.{factory} at {site.file}:{site.line}")
    remedies = tuple(dataclasses.replace(r, source=where.get(r.target, r.source)) for r in finding.remedies)
    first = next(iter(where.values()))
    return _reworded(dataclasses.replace(finding, message=message, source=finding.source or first), remedies)


def with_move_source(finding: Finding, handled: Mapping[str, Any]) -> Finding:
    """A DD201 on a named pipeline tensor: its source and its to-device remedy at the last line that handled it."""
    if finding.code != "DD201":
        return finding
    moves = {r.target: handled[r.target].origin or handled[r.target].source for r in finding.remedies
             if _moves(r) and r.target in handled}
    if not moves:
        return finding
    remedies = tuple(dataclasses.replace(r, source=moves.get(r.target, r.source)) for r in finding.remedies)
    return _reworded(dataclasses.replace(finding, source=next(iter(moves.values()))), remedies)


def with_bound_source(finding: Finding, bound: Any, handled: Mapping[str, Any]) -> Finding:
    """A DD201 on an input that reached the model by a plain name, or on a model that did: the
    finding names the user's line that last bound that name (`data, target = data, target.to(device)`,
    `model = Net()`): the line the dropped move belongs on. An input a user op handled later in that
    function (or in another function: `get_batch`'s `pin_memory()`) keeps the handled line."""
    if finding.code != "DD201":
        return finding
    from dtype_doctor.source.bindings import same_function

    for r in finding.remedies:
        if not _moves(r):
            continue
        if r.target == "model" and bound.model is not None:
            return dataclasses.replace(finding, source=bound.model)
        loc, seen = bound.inputs.get(r.target), handled.get(r.target)
        if loc is None:
            continue
        if seen is None or seen.source is None or (seen.source.file == loc.file and seen.source.line < loc.line
                                                   and same_function(loc.file, seen.source.line, loc.line)):
            # the move goes on that line too (`data, target = data.to(device), target.to(device)`)
            remedies = tuple(dataclasses.replace(x, source=loc) if x is r else x for x in finding.remedies)
            return _reworded(dataclasses.replace(finding, source=loc), remedies)
    return finding


# torch factories whose device is the caller's free choice (no data to take it from): made in a model's own
# method without device=, the tensor is on the CPU because that line said nothing.
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "eye"})


def with_made_source(finding: Finding, lineage: Mapping[str, Sequence[Any]], model: Any) -> Finding:
    """A DD201 on a step input a method of the model made without device= (an LSTM's `init_hidden`
    called from the script's loop) and nothing moved since: its source and its to-device remedy at
    that factory call, where device= belongs (the tensor is then made where the model is), not at the
    last line that handled it."""
    if finding.code != "DD201":
        return finding
    made: dict[str, tuple[str, SourceLoc]] = {}
    for r in finding.remedies:
        chain = lineage.get(r.target, ()) if _moves(r) else ()
        first = chain[0] if chain else None
        if first is None or first.source is None or not first.detail.startswith("created by torch."):
            continue
        factory = first.detail.removeprefix("created by torch.")
        if factory in _FACTORIES and all(s.device == first.device for s in chain) and _in_model_class(first.source, model):
            made[r.target] = (factory, first.source)
    if not made:
        return finding
    remedies = tuple(dataclasses.replace(r, target=f"created:aten.{made[r.target][0]}@", stage="model-code", source=made[r.target][1])
                     if r.target in made else r for r in finding.remedies)
    return _reworded(dataclasses.replace(finding, source=next(iter(made.values()))[1]), remedies)


def _in_model_class(site: SourceLoc, model: Any) -> bool:
    """Whether `site` is inside the source of one of the model's own (not torch's) module classes."""
    from pathlib import Path

    for cls in {type(m) for m in model.modules()} if model is not None else ():
        if cls.__module__.startswith("torch."):
            continue
        try:
            lines, start = inspect.getsourcelines(cls)
            file = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        if file and Path(site.file).name == Path(file).name and start <= site.line < start + len(lines):
            return True
    return False


def _moves(r: Remedy) -> bool:
    """Whether the remedy's strategy moves a tensor (to-device), as the strategy says."""
    from dtype_doctor.fix.strategies import STRATEGIES

    strategy = STRATEGIES.get(r.strategy)
    return strategy is not None and strategy.moves_tensor


def _reworded(finding: Finding, remedies: tuple[Remedy, ...]) -> Finding:
    """`finding` with `remedies`, its fix texts said again from them (its advice kept as it was)."""
    from dtype_doctor.fix.strategies import suggestions

    advice = [f.description for f in finding.fixes if f.applicability == "display-only"]
    return dataclasses.replace(finding, remedies=remedies, fixes=suggestions(remedies, advice))


def _site(sites: Sequence[SourceLoc], model: Any, module: str) -> SourceLoc | None:
    """The line among `sites` in the code of the module that made the tensor, else the first."""
    if not sites:
        return None
    try:
        owner = type(model.get_submodule(module)) if model is not None else None
        lines, start = inspect.getsourcelines(owner) if owner is not None else ([], 0)
        file = inspect.getsourcefile(owner) if owner is not None else None
    except (AttributeError, TypeError, OSError):
        return sites[0]
    from pathlib import Path

    for site in sites:
        if file and Path(site.file).name == Path(file).name and start <= site.line < start + len(lines):
            return site
    return sites[0]


def _with_attribute_source(finding: Finding, model: Any) -> Finding:
    """A finding on a tensor the model keeps as a plain attribute (a RoPE table `model.to()` left
    behind) names the line of `__init__` that assigned it, where the fix registers it as a buffer."""
    where = {t.origin: site for t in finding.tensors
             if t.origin and t.origin.startswith("attribute:") and (site := attribute_site(model, t.origin.removeprefix("attribute:")))}
    if not where:
        return finding
    remedies = tuple(dataclasses.replace(r, source=where.get(r.target, r.source)) for r in finding.remedies)
    return _reworded(dataclasses.replace(finding, source=finding.source or next(iter(where.values()))), remedies)


def attribute_site(model: Any, name: str) -> SourceLoc | None:
    """The line of the user's class that assigns `self.ATTR` for the attribute `name` ("layers.0.freqs")."""
    import ast
    import textwrap

    from dtype_doctor.machine.user_code import display_path

    path, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(path) if model is not None else None
    except AttributeError:
        return None
    for cls in type(owner).__mro__ if owner is not None else ():
        if cls.__module__.startswith("torch."):
            break
        try:
            lines, start = inspect.getsourcelines(cls)
            file = inspect.getsourcefile(cls)
        except (TypeError, OSError):
            continue
        for node in ast.walk(ast.parse(textwrap.dedent("".join(lines)))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if file and any(isinstance(e, ast.Attribute) and e.attr == attr and isinstance(e.value, ast.Name) and e.value.id == "self" for e in flat):
                return SourceLoc(display_path(file), start + node.lineno - 1)
    return None
