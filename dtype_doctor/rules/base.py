"""The Rule record: a permanent code, its documentation, and a pure check of a Trace.

A finding states its fix as data: `remedies` (Remedy records: which strategy, on what, giving
which dtype or device), which `fix` applies, and `hints`, shown but never applied (a Remedy, or
advice in words that no strategy applies). The finding's `fixes` (the words the reports show)
are worded from them a layer up, by the strategy table (dtype_doctor.fix.strategies.worded):
the rules never import the fixes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from dtype_doctor.records import Finding, FixSuggestion, OpCall, Remedy, SourceLoc, TensorMeta, Trace


@dataclass(frozen=True)
class Rule:
    code: str
    name: str  # the pattern it flags, never the fix
    severity: str  # default severity; a finding may lower it
    summary: str  # what it flags, one line
    why: str  # why it is bad
    example: str  # a failing snippet or report
    fix: str  # how to fix it
    fix_safety: str  # which fix strategies apply and how safe they are
    check: Callable[[Trace], Iterable[Finding]] = field(repr=False, compare=False, default=lambda t: ())
    references: tuple[str, ...] = ()
    # Which device's behaviour the rule judges when CPU and CUDA differ.
    device_note: str = ""
    # For rules about ops PyTorch refuses: whether a real device would raise on this op.
    # Fake kernels do not check dtypes, so a simulated trace repairs where this says so,
    # exactly as a real trace repairs after the real error.
    rejects: Callable[[OpCall], bool] | None = field(repr=False, compare=False, default=None)
    # For rules that explain a failed step (an error that is not a dtype or device refusal but
    # whose cause is a dtype): whether this trace's failure is theirs to report, not DD001's.
    explains: Callable[[Trace], bool] | None = field(repr=False, compare=False, default=None)

    def finding(
        self,
        message: str,
        *,
        module: str = "",
        module_type: str = "",
        op: str | None = None,
        stage: str = "model-code",
        tensors: Iterable[TensorMeta] = (),
        source: SourceLoc | None = None,
        severity: str | None = None,
        pytorch_error: str | None = None,
        remedies: Iterable[Remedy] = (),
        hints: Iterable[Remedy | str] = (),
        fixes: Iterable[FixSuggestion] | None = None,
    ) -> Finding:
        """A finding of this rule, its fix as data (`remedies`, `hints`); `fixes` (the texts
        written out, as rules once did) are kept as given, else worded by the strategies."""
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            message=message,
            module=module,
            module_type=module_type,
            op=op,
            stage=stage,
            tensors=tuple(tensors),
            source=source,
            fixes=tuple(fixes) if fixes is not None else (),
            pytorch_error=pytorch_error,
            remedies=tuple(remedies),
            hints=tuple(hints),
        )
