"""The fix strategies: one module a strategy, discovered (as rules are), one table.

Adding a strategy is one module here holding a `Strategy` subclass (name, applicability,
summary, rank, suggestion, describe, plan/apply, edits, module_part), its test, and the
codemod its edits use. Everything else (the `--strategy` help, `auto`'s order, the report's
change texts, the patch chains, the fix module's parts, a rule's suggested fix) reads this table.
No torch is imported here.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Iterable

from dtype_doctor.fix.outcome import Change, Step
from dtype_doctor.fix.strategies.base import SAFE, UNSAFE, Context, Pipeline, Site, Skip, Strategy
from dtype_doctor.fix.strategies.half_model import convert_keeping_fp32
from dtype_doctor.records import FixSuggestion, Remedy


def _discover() -> dict[str, Strategy]:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    found = [cls() for cls in Strategy.__subclasses__()]
    return {s.name: s for s in sorted(found, key=lambda s: s.rank)}


STRATEGIES: dict[str, Strategy] = _discover()
# `auto` tries them in rank order: least invasive first. keep-fp32 changes the precision of a
# few modules (weights stay float32 or go to the half dtype the model already runs in), after
# the fixes that touch no weights and before converting the whole model.
AUTO_ORDER = tuple(STRATEGIES)
NAMES = (*STRATEGIES, "auto")


def describe(c: Change) -> str:
    """One change as the report says it, in the words of the strategy it belongs to."""
    strategy = STRATEGIES.get(c.kind)
    return strategy.describe(c) if strategy else f"{c.kind} {c.target} → {c.to}"


def suggestion(strategy: str, to: str) -> FixSuggestion:
    """The fix a finding shows for a remedy of `strategy` giving `to`, in the strategy's words."""
    s = STRATEGIES[strategy]
    return FixSuggestion(s.name, s.applicability, s.suggestion(to))


def suggestions(remedies: "Iterable[Remedy]") -> tuple[FixSuggestion, ...]:
    """The fixes a finding shows for its remedies: one per strategy, in the first remedy's words."""
    seen: dict[str, FixSuggestion] = {}
    for r in remedies:
        seen.setdefault(r.strategy, suggestion(r.strategy, r.to))
    return tuple(seen.values())


def help_text() -> str:
    """The `--strategy` help: every strategy in `auto`'s order, and what it does."""
    return "auto (each in turn, least invasive first) | " + " | ".join(
        f"{s.name}{' [unsafe]' if s.applicability == UNSAFE else ''}: {s.summary}" for s in STRATEGIES.values()
    )


__all__ = [
    "AUTO_ORDER", "NAMES", "SAFE", "STRATEGIES", "UNSAFE", "Change", "Context", "Pipeline", "Site", "Skip", "Step",
    "Strategy", "convert_keeping_fp32", "describe", "help_text", "suggestion", "suggestions",
]
