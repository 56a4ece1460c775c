"""What a fix did, as frozen records (no torch): the changes, each strategy's step, the patch,
and the whole outcome the report shows. Formatters read these; `to_dict()` is the JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dtype_doctor.records import Finding, SourceLoc


# The `kind` a report's JSON has always given a change, where it is not the strategy's name.
# Reports already carry these values (SPEC extends, never renames); `strategy` gives the name.
JSON_KIND = {
    "cast-inputs": "cast-input",
    "half-model": "convert-model",
    "to-device": "move-input",
    "fp32-trainable": "trainable-fp32",
}


@dataclass(frozen=True, slots=True)
class Change:
    """One concrete edit: what the patch writer turns into code."""

    kind: str  # the strategy it belongs to (dtype_doctor.fix.strategies)
    target: str  # input name, or "model"
    to: str  # dtype or device
    before: str | None = None
    stage: str | None = None  # lineage stage that produced the value (for cast-inputs)
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": JSON_KIND.get(self.kind, self.kind),
            "strategy": self.kind,
            "target": self.target,
            "from": self.before,
            "to": self.to,
            "stage": self.stage,
            "source": self.source.to_dict() if self.source else None,
        }


@dataclass(frozen=True, slots=True)
class Step:
    """The outcome of one strategy in one round: a value, never an exception."""

    strategy: str
    status: str  # applied | skipped | failed
    detail: str
    changes: tuple[Change, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "status": self.status,
            "detail": self.detail,
            "changes": [c.to_dict() for c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class CodemodOutcome:
    """One codemod run on one file: applied, skipped (with why) or failed."""

    file: str
    codemod: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "codemod": self.codemod, "status": self.status, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class PatchOutcome:
    """The patch written (path, files) or, with path None, why none could be. `unwritten`:
    the verified changes the patch leaves out, each with why (a patch that leaves one out is
    not the fix); `check`: the command that checks the patched pipeline, where one can."""

    path: str | None
    files: tuple[str, ...] = ()
    edits: tuple[CodemodOutcome, ...] = ()
    notes: tuple[str, ...] = ()
    skipped: str | None = None
    unwritten: tuple[str, ...] = ()
    check: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "files": list(self.files),
            "edits": [e.to_dict() for e in self.edits],
            "notes": list(self.notes),
        }
        if self.unwritten:
            out["unwritten"] = list(self.unwritten)
        if self.check:
            out["check"] = self.check
        return out


@dataclass(frozen=True)
class FixOutcome:
    """SPEC.md's `fix` block as a record: what was applied, whether the re-run is clean,
    what it cost, and the patch. Measurements (parity, cost, tradeoff) stay plain values."""

    strategy: str
    steps: tuple[Step, ...]
    verified: bool
    after_findings: tuple[Finding, ...]
    after_summary: Mapping[str, int]
    converged: bool
    rounds: int
    detail: str
    parity: Mapping[str, Any] | None = None
    cost: Mapping[str, Any] | None = None
    tradeoff: Mapping[str, Any] | None = None
    patch: PatchOutcome | None = None
    patch_skipped: str | None = None  # a patch was asked for and none was written: why

    def to_dict(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "strategy": self.strategy,
            "applied": [s.to_dict() for s in self.steps],
            "verified": self.verified,
            "after": {"findings": [f.to_dict() for f in self.after_findings], "summary": dict(self.after_summary)},
            "parity": dict(self.parity) if self.parity else None,
            "patch": self.patch.to_dict() if self.patch and self.patch.path else None,
            "converged": self.converged,
            "rounds": self.rounds,
            "detail": self.detail,
            "cost": dict(self.cost) if self.cost else None,
            "tradeoff": dict(self.tradeoff) if self.tradeoff else None,
        }
        if self.patch_skipped:
            block["patch_skipped"] = self.patch_skipped
        return block
