"""The codemod contract: EditResult, Codemod (never raises: applied, skipped with why, or failed),
run_codemods; the dtype vocabulary comes from dtype_doctor.source.analysis. No torch import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import libcst as cst

# The dtype vocabulary is the one analysis's (dtype_doctor.source.analysis); codemods import it from here.
from dtype_doctor.source.analysis import (  # noqa: F401
    NotInSource,
    CAST_METHODS,
    DTYPE_METHODS,
    EXTRA_ALIASES,
    FLOATING,
    HALF,
    INTEGER,
    METHOD_DTYPES,
    NUMPY_DTYPES,
    STRING_DTYPES,
    TORCH_DTYPES,
    dtype_family,
    normalize_dtype,
)


Status = Literal["applied", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class EditResult:
    """What one codemod did to one file. ``new_source`` is set only when applied."""

    status: Status
    codemod: str
    detail: str
    new_source: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def applied(self) -> bool:
        return self.status == "applied"

    def to_dict(self) -> dict[str, Any]:
        return {
            "codemod": self.codemod,
            "status": self.status,
            "detail": self.detail,
            "warnings": list(self.warnings),
        }


def run_codemods(source: str, filename: str, codemods: Iterable[Codemod]) -> tuple[str, tuple[EditResult, ...]]:
    """Apply codemods in order, each to the previous one's output; return the final text."""
    results = []
    current = source
    for codemod in codemods:
        result = codemod.apply(current, filename)
        results.append(result)
        if result.applied and result.new_source is not None:
            current = result.new_source
    return current, tuple(results)


# ---------------------------------------------------------------------------------------
# Codemod base


class _Skip(Exception):
    """Raised inside a codemod to end it with status "skipped" and this reason."""


class Codemod(ABC):
    """One source transformation. Subclasses set DESCRIPTION and implement ``_apply``."""

    DESCRIPTION: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    def apply(self, source: str, filename: str) -> EditResult:
        warnings: list[str] = []
        try:
            new_source, detail = self._apply(source, filename, warnings)
        except (_Skip, NotInSource) as skip:
            return EditResult("skipped", self.name, str(skip), None, tuple(warnings))
        except cst.ParserSyntaxError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
            return EditResult("failed", self.name, f"cannot parse {filename}: {first}", None, tuple(warnings))
        except Exception as exc:  # a codemod bug must not take the fix command down
            return EditResult(
                "failed", self.name, f"{self.name} failed on {filename}: {type(exc).__name__}: {exc}", None, tuple(warnings)
            )
        if new_source == source:
            return EditResult("skipped", self.name, f"nothing to change in {filename}", None, tuple(warnings))
        problem = _compile_problem(source, new_source, filename)
        if problem:
            return EditResult("failed", self.name, problem, None, tuple(warnings))
        return EditResult("applied", self.name, detail, new_source, tuple(warnings))

    @abstractmethod
    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        """Return (new source, detail) or raise _Skip(reason)."""


def _compile_problem(before: str, after: str, filename: str) -> str | None:
    try:
        compile(before, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None  # the original does not compile here either; nothing to compare against
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        return f"the rewritten {filename} would not compile ({exc}); left unchanged"
    return None


class AllOf(Codemod):
    """Several codemods on one file as one step (e.g. set dtype= at load, drop the later
    .half()): applied when any of them applied, each working on the previous one's output."""

    def __init__(self, codemods: Iterable[Codemod]):
        self.codemods = tuple(codemods)

    @property
    def name(self) -> str:
        return "+".join(c.name for c in self.codemods)

    def apply(self, source: str, filename: str) -> EditResult:
        text, results = run_codemods(source, filename, self.codemods)
        applied = [r for r in results if r.applied]
        warnings = tuple(w for r in results for w in r.warnings)
        if not applied:
            return EditResult("skipped", self.name, "; ".join(f"{r.codemod}: {r.detail}" for r in results), None, warnings)
        return EditResult("applied", self.name, "; ".join(r.detail for r in applied), text, warnings)

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        raise NotImplementedError  # apply() is overridden


@dataclass(frozen=True)
class Attempt:
    """One codemod on one file, tried in turn for a change (a strategy's `edits`)."""

    file: "Path"
    codemod: Codemod
