"""The rule catalogue: every `ddNNN_*.py` module in this package defines one RULE.

Adding a rule is adding its module (and its test); nothing here changes.
"""

from __future__ import annotations

from typing import Iterable

from dtype_doctor.records.errors import UsageError
from dtype_doctor.records import SEVERITY_RANK, Finding, OpCall, Trace
from dtype_doctor.rules.base import Rule
from dtype_doctor.rules.catalogue import all_rules, rejected_by

# Codes that were renamed keep working: old code → new code. Codes are never reused.
REDIRECTS: dict[str, str] = {}


def refusal(op: OpCall) -> str | None:
    """Where a real device would raise when no kernel can be asked (a simulated trace's
    fallback): the first rule that says it rejects the op. The trace is handed this function
    (TraceSession's `refusal`); it never imports the rules."""
    rule = rejected_by(op)
    return None if rule is None else f"a real device would raise here ({rule.code} {rule.name})"


def get_rule(code: str) -> Rule:
    wanted = REDIRECTS.get(code.upper(), code.upper())
    for rule in all_rules():
        if rule.code == wanted or rule.name == code.lower():
            return rule
    known = ", ".join(r.code for r in all_rules())
    raise UsageError(f"unknown rule {code!r}; known rules: {known}")


def parse_codes(codes: Iterable[str] | str | None) -> tuple[str, ...] | None:
    """'DD1,DD201' → ('DD1', 'DD201'); each must be a known code or a prefix of one."""
    if codes is None:
        return None
    items = [c.strip().upper() for c in (codes.split(",") if isinstance(codes, str) else codes) if c.strip()]
    items = [REDIRECTS.get(c, c) for c in items]
    known = [r.code for r in all_rules()]
    for c in items:
        if not any(k.startswith(c) for k in known):
            raise UsageError(f"unknown rule code or prefix {c!r}; known rules: {', '.join(known)}")
    return tuple(items)


def selected(rule: Rule, select: tuple[str, ...] | None, ignore: tuple[str, ...] | None) -> bool:
    if select is not None and not any(rule.code.startswith(s) for s in select):
        return False
    return not (ignore and any(rule.code.startswith(i) for i in ignore))


def run_rules(
    trace: Trace,
    *,
    select: Iterable[str] | str | None = None,
    ignore: Iterable[str] | str | None = None,
) -> tuple[Finding, ...]:
    sel, ign = parse_codes(select), parse_codes(ignore)
    findings: list[Finding] = []
    for rule in all_rules():
        if selected(rule, sel, ign):
            findings.extend(rule.check(trace))
    if selected(get_rule("DD001"), sel, ign):
        from dtype_doctor.rules.dd001_trace_failed import unreported

        findings.extend(unreported(trace, findings))
    # Errors first; within a severity, rule order then pipeline order.
    return tuple(sorted(findings, key=lambda f: -SEVERITY_RANK[f.severity]))
