"""The catalogue itself: every `ddNNN_*.py` module of this package, discovered, and what it says
of an op. Its own module so that a rule that asks the catalogue (DD001: does another rule explain
this failure?) imports this, not the package that runs it."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from pathlib import Path

from dtype_doctor.records import OpCall
from dtype_doctor.rules.base import Rule


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    rules = []
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("dd") and info.name[2:5].isdigit():
            rules.append(importlib.import_module(f"{__package__}.{info.name}").RULE)
    return tuple(sorted(rules, key=lambda r: r.code))


def rejected_by(op: OpCall) -> Rule | None:
    """The first rule that says a real device would raise on `op`, if any."""
    for rule in all_rules():
        if rule.rejects is not None and rule.rejects(op):
            return rule
    return None
