"""Resuming: the optimizer state the step met, against its parameters (run/resume.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.trace import SourceLoc


@dataclass(frozen=True, slots=True)
class Restored:
    """A `load_state_dict` the script called: what (model | optimizer | scaler), its class, its line."""

    kind: str
    class_name: str
    source: SourceLoc | None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": self.class_name, "source": self.source.to_dict() if self.source else None}


@dataclass(frozen=True, slots=True)
class StateCast:
    """A saved tensor a `load_state_dict` cast on its way in: an optimizer state tensor (`key`) cast to
    its parameter's dtype, or a model tensor copied into a parameter of another dtype (`key` "")."""

    kind: str  # optimizer | model
    class_name: str
    param: str
    key: str
    saved: str  # dtype
    loaded: str
    source: SourceLoc | None
    count: int = 1  # the tensors cast alike (a model's: every weight of that dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "class": self.class_name, "param": self.param, "key": self.key, "saved": self.saved,
                "loaded": self.loaded, "count": self.count, "source": self.source.to_dict() if self.source else None}


@dataclass(frozen=True, slots=True)
class StateMismatch:
    """An optimizer state tensor of another dtype or device than its parameter when the step began;
    `stepped`: whether the optimizer's step went through (False: it raised)."""

    class_name: str
    param: str
    key: str
    state: str  # "float32 cpu"
    parameter: str
    source: SourceLoc | None  # the script's optimizer.step() line
    stepped: bool
    loaded_at: SourceLoc | None = None  # the optimizer's load_state_dict line, when it was restored

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.class_name, "param": self.param, "key": self.key, "state": self.state,
                "parameter": self.parameter, "stepped": self.stepped,
                "source": self.source.to_dict() if self.source else None,
                "loaded_at": self.loaded_at.to_dict() if self.loaded_at else None}


@dataclass(frozen=True, slots=True)
class Resume:
    restored: tuple[Restored, ...] = ()
    casts: tuple[StateCast, ...] = ()
    mismatches: tuple[StateMismatch, ...] = ()
    refused_ops: tuple[int, ...] = ()  # the trace's ops an optimizer step with mismatched state refused (DD404's, not DD100's)

    def to_dict(self) -> dict[str, Any]:
        return {"restored": [r.to_dict() for r in self.restored], "casts": [c.to_dict() for c in self.casts],
                "mismatches": [m.to_dict() for m in self.mismatches]}


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    """The dtypes a checkpoint file holds, read without loading its tensors (load/checkpoint.py):
    its format, and each saved tensor's name and dtype (a model's weights; an optimizer's state
    under "optimizer." where the file holds one)."""

    path: str
    format: str  # safetensors | torch | dcp
    tensors: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for _, dtype in self.tensors:
            counts[dtype] = counts.get(dtype, 0) + 1
        return {"path": self.path, "format": self.format, "tensors": len(self.tensors), "dtypes": counts}
