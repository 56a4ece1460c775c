"""The fix strategies: one module a strategy, discovered (as rules are), one table.

Adding a strategy is one module here holding a `Strategy` subclass (name, applicability,
summary, rank, json_kind, suggestion, describe, plan/apply, edits, and its part of the fix
module: fix_module, module_part, module_fields), its test, and the codemod its edits use.
Everything else (the `--strategy` help, `auto`'s order, the report's change texts and JSON
kinds, the patch chains, the generated fix module, a rule's suggested fix) reads this table.
No torch is imported here.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import Iterable

from dtype_doctor.fix.outcome import Change, Step
from dtype_doctor.fix.strategies.base import SAFE, UNSAFE, Context, Pipeline, Site, Skip, Strategy, defined, describe
from dtype_doctor.fix.strategies.half_model import convert_keeping_fp32
from dtype_doctor.records import Finding, FixSuggestion, Remedy


def _discover() -> dict[str, Strategy]:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    found = [cls() for cls in defined().values()]
    return {s.name: s for s in sorted(found, key=lambda s: s.rank)}


STRATEGIES: dict[str, Strategy] = _discover()
# `auto` tries them in rank order: least invasive first. keep-fp32 changes the precision of a
# few modules (weights stay float32 or go to the half dtype the model already runs in), after
# the fixes that touch no weights and before converting the whole model.
AUTO_ORDER = tuple(STRATEGIES)
NAMES = (*STRATEGIES, "auto")


def suggestion(strategy: str, to: str, target: str = "") -> FixSuggestion:
    """The fix a finding shows for one remedy of `strategy` giving `target` (default: unnamed)
    `to`, in the strategy's words."""
    return suggestions([Remedy(strategy, target, to)])[0]


# What a finding's advice (a hint in words, no strategy's) is filed under when the finding
# names no remedy: the strategy its words are nearest, as findings always filed it.
ADVICE_STRATEGY = "cast-inputs"


def suggestions(remedies: "Iterable[Remedy]", hints: "Iterable[Remedy | str]" = ()) -> tuple[FixSuggestion, ...]:
    """The fixes a finding shows: one per strategy, in that strategy's words, for its remedies
    (applied by `fix`) and the remedies among its hints (shown, never applied); then each hint
    in words (advice no strategy applies: display-only, under the first strategy shown)."""
    hints = tuple(hints)
    by_strategy: dict[str, list[Remedy]] = {}
    for r in (*remedies, *(h for h in hints if isinstance(h, Remedy))):
        by_strategy.setdefault(r.strategy, []).append(r)
    shown = [_worded(s, rs) for s, rs in by_strategy.items()]
    lead = next(iter(by_strategy), ADVICE_STRATEGY)
    # Advice reads as the alternative to a fix ("or pass a bool mask"); alone, without its "or".
    advice = [h if shown else h.removeprefix("or ") for h in hints if isinstance(h, str)]
    return (*shown, *(FixSuggestion(lead, "display-only", h) for h in advice))


def worded(findings: "Iterable[Finding]") -> tuple[Finding, ...]:
    """The findings with their fixes in words: a rule states its fix as data (remedies, hints)
    and never imports the strategies; the words are put on here, where the rules' findings
    become a report. A finding whose rule wrote its `fixes` out keeps them."""
    return tuple(f if f.fixes or not (f.remedies or f.hints) else replace(f, fixes=suggestions(f.remedies, f.hints))
                 for f in findings)


def _worded(strategy: str, remedies: list[Remedy]) -> FixSuggestion:
    known = STRATEGIES.get(strategy)
    if known is None:  # a rule naming a strategy no module defines: said plainly, never applied
        return FixSuggestion(strategy, "display-only", "; ".join(f"{strategy} {r.target} → {r.to}" for r in remedies))
    return FixSuggestion(strategy, known.applicability, known.suggestion(remedies))


def at_entry(finding: Finding) -> frozenset[str]:
    """The inputs a finding's fix changes where they enter the script (a strategy's `at_entry`: mps-float32's
    cast before the copy to mps). fix --run tries such a finding first, and the other findings on those
    inputs wait a round, as its edit may clear them too. Empty for any other finding."""
    return frozenset(r.target for r in finding.remedies if getattr(STRATEGIES.get(r.strategy), "at_entry", False))


def help_text() -> str:
    """The `--strategy` help: every strategy in `auto`'s order, and what it does."""
    return "auto (each in turn, least invasive first) | " + " | ".join(
        f"{s.name}{' [unsafe]' if s.applicability == UNSAFE else ''}: {s.summary}" for s in STRATEGIES.values()
    )


__all__ = [
    "ADVICE_STRATEGY", "at_entry", "AUTO_ORDER", "NAMES", "SAFE", "STRATEGIES", "UNSAFE", "Change", "Context", "Pipeline", "Site", "Skip", "Step",
    "Strategy", "convert_keeping_fp32", "describe", "help_text", "suggestion", "suggestions", "worded",
]
