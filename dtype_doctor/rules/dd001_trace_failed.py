"""DD001: the forward or backward failed for a reason the other rules do not cover."""

from __future__ import annotations

from typing import Iterable, Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    yield from _assumed(trace)
    failure = trace.failure
    if failure is None:
        return
    if failure.kind in ("dtype", "device", "overflow"):
        return  # a refusal: the rule that explains it (DD301 for a number beyond a dtype), or DD100, reports it
    if _explained(trace):
        return  # an error whose cause is a dtype (DD111's labels): that rule reports it
    what = {
        "other": "failed for a reason that is not dtype or device",
        "simulation": "could not be simulated with fake tensors",
    }.get(failure.kind, "failed")
    yield RULE.finding(
        f"the {failure.phase} pass {what}: {failure.message}",
        # A step fake tensors cannot take is a limit of --simulate, not a fault in the pipeline.
        severity="warning" if failure.kind == "simulation" else None,
        module=failure.module,
        module_type=failure.module_type,
        op=failure.op,
        stage="model-code",
        pytorch_error=failure.message,
    )


def unreported(trace: Trace, findings: Iterable[Finding]) -> Iterator[Finding]:
    """The net under every rule: a trace that stopped on an error gets at least one error finding.

    A refusal is left to the rule that explains it (above); when no rule produced an error
    for it after all (a refusal of a shape no rule reads, such as a factory op's `dtype=`),
    it is reported here with PyTorch's message. A clean report for a forward that raised is
    the one answer the doctor must never give.
    """
    failure = trace.failure
    if failure is None or failure.kind == "simulation" or any(f.severity == "error" for f in findings):
        return
    yield RULE.finding(
        f"the {failure.phase} pass failed and no rule explains it: {failure.message}",
        module=failure.module,
        module_type=failure.module_type,
        op=failure.op,
        stage="model-code",
        pytorch_error=failure.message,
    )


def _explained(trace: Trace) -> bool:
    from dtype_doctor.rules.catalogue import all_rules

    return any(rule.explains is not None and rule.explains(trace) for rule in all_rules())


def _assumed(trace: Trace) -> Iterator[Finding]:
    """Conditions on tensor values a simulated trace took as False (fake tensors hold none)."""
    assumed = [op for op in trace.ops if op.attr("assumed") is not None]
    if not assumed:
        return
    first = assumed[0]
    where = f" in {first.module_type}" if first.module_type else ""
    more = f" (and {len(assumed) - 1} more)" if len(assumed) > 1 else ""
    yield RULE.finding(
        f"a condition on tensor values{where} was taken as {first.attr('assumed')}{more}: fake tensors hold no values, "
        "so the simulated trace followed that branch (the one valid inputs take in torch's own checks); a real run "
        "may take the other",
        severity="info",
        module=first.module,
        module_type=first.module_type,
        op=first.op,
        stage="model-code",
    )


RULE = Rule(
    code="DD001",
    name="trace-failed",
    severity="error",
    summary="The traced forward or backward stopped with an error (a shape error, a missing input, ...); findings after that point are missing.",
    why=(
        "The doctor steps over dtype and device errors to find them all, but cannot go past other errors. "
        "What was traced before the failure is still checked."
    ),
    example="RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x16 and 32x8)",
    fix="Fix the error PyTorch names, then scan again.",
    fix_safety="no automatic fix.",
    check=check,
)
