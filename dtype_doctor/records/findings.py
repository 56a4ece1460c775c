"""Findings, with the fixes their rules state as data (Remedy), and findings held back (Suppressed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.tensors import TensorMeta
from dtype_doctor.records.trace import SourceLoc


SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True, slots=True)
class FixSuggestion:
    strategy: str
    applicability: str  # safe | unsafe | display-only
    description: str

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "applicability": self.applicability, "description": self.description}


@dataclass(frozen=True, slots=True)
class Remedy:
    """A fix a rule knows, as data: which strategy, applied to what, giving which dtype/device.

    `target` is a model input's name (cast-inputs, to-device), a module's dotted name or
    "model" (half-model, keep-fp32), "forward" (autocast) or "trainable" (fp32-trainable).
    `stage`/`source` say where in the pipeline the value should be changed, when known.
    """

    strategy: str
    target: str
    to: str  # a dtype or a device
    stage: str | None = None
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "target": self.target,
            "to": self.to,
            "stage": self.stage,
            "source": self.source.to_dict() if self.source else None,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    name: str
    severity: str
    message: str
    module: str = ""
    module_type: str = ""
    op: str | None = None
    stage: str = "model-code"
    tensors: tuple[TensorMeta, ...] = ()
    source: SourceLoc | None = None
    fixes: tuple[FixSuggestion, ...] = ()
    # PyTorch's own words when the op really raised; a finding key docs/report.md lists.
    pytorch_error: str | None = None
    # The fixes as data: what the fix strategies apply (a finding key docs/report.md lists).
    remedies: tuple[Remedy, ...] = ()
    # Shown, never applied: remedies and advice in words. With `remedies`, what `fixes` are
    # worded from (fix.strategies.worded: a rule states its fix as data, the strategies word it).
    hints: tuple[Remedy | str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """What stays the same when the same mismatch is found again (a baseline's key, SARIF's
        partialFingerprints): the rule, where in the model, the op, the stage and the tensors'
        names and roles. Not the message (it quotes measured values), the dtypes (they are the
        finding), shapes (the batch size) or source lines (they move as the file is edited)."""
        import hashlib

        tensors = ",".join(sorted(f"{t.role}={t.name or ''}" for t in self.tensors))
        source = self.source.file.replace("\\", "/") if self.source else ""
        key = "\0".join(("v1", self.code, self.module, self.op or "", self.stage, tensors, source))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "module": self.module,
            "module_type": self.module_type,
            "op": self.op,
            "stage": self.stage,
            "tensors": [t.to_dict() for t in self.tensors],
            "source": self.source.to_dict() if self.source else None,
            "fixes": [f.to_dict() for f in self.fixes],
            "fingerprint": self.fingerprint,
        }
        if self.pytorch_error:
            d["pytorch_error"] = self.pytorch_error
        if self.remedies:
            d["remedies"] = [r.to_dict() for r in self.remedies]
        return d


@dataclass(frozen=True, slots=True)
class Suppressed:
    """A finding held back from the report, and what held it: `comment` (the user's source line)
    or `baseline` (a --baseline file)."""

    finding: Finding
    by: str

    def to_dict(self) -> dict[str, Any]:
        f = self.finding
        return {"code": f.code, "severity": f.severity, "module": f.module, "message": f.message,
                "source": f.source.to_dict() if f.source else None, "fingerprint": f.fingerprint, "by": self.by}
