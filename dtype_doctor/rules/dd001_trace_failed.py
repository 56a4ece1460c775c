"""DD001: the forward or backward failed for a reason the other rules do not cover."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    failure = trace.failure
    if failure is None:
        return
    from dtype_doctor.rules import rejected_by

    # One error raised through nested records (F.cross_entropy, then aten.nll_loss_forward):
    # when a rule judges any of them, that rule reports it (watch() does not step over errors).
    failing = [op for op in trace.ops if op.error == failure.message and not op.recovered]
    if failure.kind in ("dtype", "device") and any(rejected_by(op) is not None for op in failing):
        return
    what = {
        "other": "failed for a reason that is not dtype or device",
        "simulation": "could not be simulated with fake tensors",
        "dtype": "failed with a dtype error the trace could not step over",
        "device": "failed with a device error the trace could not step over",
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
