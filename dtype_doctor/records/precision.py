"""The process's precision state: the switches every op of the step reads (the default dtype, the
TF32 switches by API, reduced-precision reductions, deterministic algorithms, the float32 matmul
precision), each with who set it, and the reads PyTorch refused because the TF32 APIs were mixed.
See docs/precision.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.trace import SourceLoc

# The APIs a switch belongs to: TF32 has two, which PyTorch refuses to read across once both were set.
LEGACY, NEW, PLAIN = "legacy", "new", "plain"
UNREADABLE = "unreadable"  # the value of a switch PyTorch refuses to read: the other TF32 API set it


@dataclass(frozen=True, slots=True)
class Setter:
    """Who set a switch: the script's line, a library's (by its package), or torch's default."""

    by: str  # "script" | "library" | "default"
    source: SourceLoc | None = None  # the line; a library's line is in its own file
    library: str | None = None  # the library's top-level package ("lightning", "transformers")
    via: SourceLoc | None = None  # a library's: the script's line that called into it

    def words(self) -> str:
        if self.by == "default":
            return "torch's default"
        where = f"{self.source.file}:{self.source.line}" if self.source else "an unknown line"
        if self.by == "script":
            return f"your script at {where}"
        called = f" (called from your line {self.via.file}:{self.via.line})" if self.via else ""
        return f"{self.library or 'a library'} at {where}{called}"

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "library": self.library, "source": self.source.to_dict() if self.source else None,
                "via": self.via.to_dict() if self.via else None}


@dataclass(frozen=True, slots=True)
class Switch:
    """One precision switch as the step found it: its name as the script writes it, its value
    ("mixed" where PyTorch refuses to read it), the API it belongs to, who set it last, and the
    value torch starts with (`initial`)."""

    name: str  # "torch.backends.cuda.matmul.allow_tf32"
    value: str
    api: str  # legacy | new | plain
    setter: Setter
    initial: str | None = None

    @property
    def changed(self) -> bool:
        return self.setter.by != "default"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "api": self.api, "initial": self.initial, "set_by": self.setter.to_dict()}


@dataclass(frozen=True, slots=True)
class Tf32Mix:
    """A read of a TF32 switch that PyTorch refused because the other API had set it: the setter's
    line (the switch it set, its API) and the reader's line (what it read), PyTorch's error."""

    set_name: str
    set_api: str
    setter: Setter
    read_name: str
    reader: Setter
    error: str  # PyTorch's message, first line

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.set_name, "set_api": self.set_api, "set_by": self.setter.to_dict(),
                "read": self.read_name, "read_by": self.reader.to_dict(), "error": self.error}


@dataclass(frozen=True, slots=True)
class DefaultDtypeChange:
    """A `torch.set_default_dtype` call: the dtype it set, the one it replaced, who called it."""

    dtype: str
    before: str
    setter: Setter

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "before": self.before, "set_by": self.setter.to_dict()}


@dataclass(frozen=True, slots=True)
class PrecisionState:
    """The switches when the step ran (`switches`), the TF32 reads refused (`mixes`), and the
    default dtype's changes in order (`default_dtype`). `watched`: whether the setters were seen
    (a `run`); a `scan` only reads the values, so every setter is unknown there."""

    switches: tuple[Switch, ...]
    mixes: tuple[Tf32Mix, ...] = ()
    default_dtype: tuple[DefaultDtypeChange, ...] = ()
    watched: bool = False

    def switch(self, name: str) -> Switch | None:
        return next((s for s in self.switches if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"watched": self.watched, "switches": [s.to_dict() for s in self.switches],
                "tf32_mixes": [m.to_dict() for m in self.mixes],
                "default_dtype_changes": [c.to_dict() for c in self.default_dtype]}
