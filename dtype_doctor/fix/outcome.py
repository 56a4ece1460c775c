"""What a fix did, as frozen records (no torch): the changes, each strategy's step, the patch,
and the whole outcome the report shows. Formatters read these; `to_dict()` is the JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from dtype_doctor.records import Finding, SourceLoc


@dataclass(frozen=True, slots=True)
class Change:
    """One concrete edit: what the patch writer turns into code."""

    kind: str  # the strategy it belongs to (dtype_doctor.fix.strategies)
    target: str  # input name, or "model"
    to: str  # dtype or device
    before: str | None = None
    stage: str | None = None  # lineage stage that produced the value (for cast-inputs)
    source: SourceLoc | None = None
    placed: SourceLoc | None = None  # to-device of one model of several: the line that placed that model

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": json_kind(self.kind),
            "strategy": self.kind,
            "target": self.target,
            "from": self.before,
            "to": self.to,
            "stage": self.stage,
            "source": self.source.to_dict() if self.source else None,
        }


# Strategy name → the `kind` its changes have in a report's JSON, where it is not the name (reports
# carry the older names: the report's names only grow, never change). Filled from below: each Strategy class
# states its json_kind and registers it here as it is defined (strategies/base.py), so this
# record module imports no strategy.
JSON_KINDS: dict[str, str] = {}


def json_kind(strategy: str) -> str:
    """The `kind` a report's JSON gives a change of `strategy`: the strategy's `json_kind`, else its name."""
    return JSON_KINDS.get(strategy, strategy)


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


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """The JSON of a measurement: the fields it has (a measurement that failed has only `error`)."""
    return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Parity:
    """The fixed pipeline's primary output against the float32 reference; or, with `error`,
    why it could not be measured."""

    reference: str | None = None  # "float32"
    output: str | None = None  # which output was compared ("logits")
    max_abs_diff: float | None = None
    cosine: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _present({"reference": self.reference, "output": self.output, "max_abs_diff": self.max_abs_diff,
                         "cosine": self.cosine, "error": self.error})


@dataclass(frozen=True, slots=True)
class Cost:
    """Weight memory before and after the fix."""

    weight_bytes_before: int
    weight_bytes_after: int

    def to_dict(self) -> dict[str, Any]:
        return {"weight_bytes_before": self.weight_bytes_before, "weight_bytes_after": self.weight_bytes_after}


@dataclass(frozen=True, slots=True)
class Peak:
    """The largest |activation| of the float32 reference, against float16's largest finite value."""

    module: str
    value: float
    float16_max: float

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "value": self.value, "float16_max": self.float16_max}


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to run in half precision (autocast, half-model), measured against float32."""

    weight_bytes: int | None = None
    max_abs_diff: float | None = None
    cosine: float | None = None
    error: str | None = None  # the forward failed this way
    max_activation: Peak | None = None

    def to_dict(self) -> dict[str, Any]:
        return _present({"weight_bytes": self.weight_bytes, "max_abs_diff": self.max_abs_diff, "cosine": self.cosine,
                         "error": self.error, "max_activation": self.max_activation.to_dict() if self.max_activation else None})


@dataclass(frozen=True, slots=True)
class Tradeoff:
    """autocast against half-model on the user's model, in `dtype`; or, with `error`, why not measured."""

    dtype: str | None = None
    reference_weight_bytes: int | None = None
    autocast: Alternative | None = None
    half_model: Alternative | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return _present({
            "dtype": self.dtype, "reference_weight_bytes": self.reference_weight_bytes,
            "autocast": self.autocast.to_dict() if self.autocast else None,
            "half-model": self.half_model.to_dict() if self.half_model else None, "error": self.error,
        })


@dataclass(frozen=True, slots=True)
class Leftover:
    """A finding a fix leaves (or one its re-run found that the first run did not), and why."""

    code: str
    message: str
    source: SourceLoc | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "source": self.source.to_dict() if self.source else None, "why": self.why}

    @property
    def said(self) -> str:
        where = f" at {self.source.file}:{self.source.line}" if self.source else ""
        return f"{self.code}{where}: {self.why}"


@dataclass(frozen=True, slots=True)
class RejectedEdit:
    """An edit that was written and run, and that the re-run did not verify: its diff, and what the re-run said."""

    strategy: str
    file: str
    codemod: str
    diff: str
    rerun: str

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "file": self.file, "codemod": self.codemod, "diff": self.diff, "rerun": self.rerun}


@dataclass(frozen=True)
class FixOutcome:
    """The `fix` block (docs/report.md) as a record: what was applied, whether the re-run is clean,
    what it cost, and the patch."""

    strategy: str
    steps: tuple[Step, ...]
    verified: bool
    after_findings: tuple[Finding, ...]
    after_summary: Mapping[str, int]
    converged: bool
    rounds: int
    detail: str
    parity: Parity | None = None
    cost: Cost | None = None
    tradeoff: Tradeoff | None = None
    patch: PatchOutcome | None = None
    patch_skipped: str | None = None  # a patch was asked for and none was written: why
    # fix --run: the findings left at or above --fail-on (each with why), those new in the re-run
    # (with why they appeared), and the edits the re-run did not verify.
    remaining: tuple[Leftover, ...] = ()
    new: tuple[Leftover, ...] = ()
    rejected: tuple[RejectedEdit, ...] = ()
    # fix --run: the patched script run on past the traced step: " at train.py:88 with RuntimeError: ..."
    # when it then failed (not verified), else how far it ran ("to its end") without an error.
    script_failed: str | None = None
    ran_on: str | None = None

    @property
    def fixed_any(self) -> bool:
        return any(s.status == "applied" for s in self.steps)

    @property
    def headline(self) -> str:
        """How the fix ended, in words that claim no more than happened: "fixed and verified" only
        where a patch was written; a fix verified on edits held in memory says so."""
        written = self.patch is not None and self.patch.path is not None
        if self.script_failed is not None:
            return f"cures the traced step; the script then fails{self.script_failed}"
        if self.verified and not self.fixed_any:
            return "nothing to fix"
        if self.verified:
            if written:
                return "fixed and verified"
            if self.patch_skipped:
                return "verified in memory, no patch written"
            return "verified in memory — pass --write-patch to write it"
        if self.fixed_any and written:
            return "partly fixed: the verified edits are in the patch"
        if self.fixed_any:
            return "partly fixed"
        return "not fixed"

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for what fix --run leaves: remaining and new findings, rejected edits."""
        # A script that failed past the step is the fix's `why` (its detail), said once there.
        rows = [("script", f"the patched script ran on {self.ran_on} without an error")] if self.ran_on else []
        rows += [("remaining", leftover.said) for leftover in self.remaining]
        rows += [("new", leftover.said) for leftover in self.new]
        rows += [("rejected", f"{e.strategy}: {e.codemod} on {e.file}; the re-run: {e.rerun}\n{e.diff}".rstrip()) for e in self.rejected]
        return rows

    def to_dict(self) -> dict[str, Any]:
        block: dict[str, Any] = {
            "strategy": self.strategy,
            "applied": [s.to_dict() for s in self.steps],
            "verified": self.verified,
            "after": {"findings": [f.to_dict() for f in self.after_findings], "summary": dict(self.after_summary)},
            "parity": self.parity.to_dict() if self.parity else None,
            "patch": self.patch.to_dict() if self.patch and self.patch.path else None,
            "converged": self.converged,
            "rounds": self.rounds,
            "detail": self.detail,
            "cost": self.cost.to_dict() if self.cost else None,
            "tradeoff": self.tradeoff.to_dict() if self.tradeoff else None,
        }
        if self.patch_skipped:
            block["patch_skipped"] = self.patch_skipped
        if self.script_failed or self.ran_on:
            block["script"] = {"failed": self.script_failed, "ran_on": self.ran_on}
        for key, items in (("remaining", self.remaining), ("new", self.new), ("rejected", self.rejected)):
            if items:
                block[key] = [item.to_dict() for item in items]
        return block
