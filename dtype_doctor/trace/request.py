"""How to trace, as one value: `diagnose`, `watch`, `fix_model` and the CLI pipeline pass it on whole."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from dtype_doctor.machine.placement import HERE, Placement
from dtype_doctor.records import Lineage, LoadFacts, SourceLoc, Subject


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """`placement` is where the step runs, decided once at the entry (machine.placement.decide):
    HERE traces where the model is, real. `move_inputs` False leaves the batch where the pipeline
    put it; `lineage`/`sources` say where each input came from; `subject` names what is traced
    in the report."""

    placement: Placement = HERE
    autocast: str | None = None  # None, "float16" or "bfloat16" ("off" is read as None)
    train: bool = False
    move_inputs: bool = True
    select: Iterable[str] | str | None = None
    ignore: Iterable[str] | str | None = None
    lineage: Lineage = field(default_factory=dict)
    sources: Mapping[str, SourceLoc] = field(default_factory=dict)
    subject: Subject | None = None
    stats: bool = True  # measure value statistics (DD301-DD303); ignored on fake tensors
    fsdp1: bool = False  # check the model's FSDP1 units (use_orig_params=False) as FlatParameters would flatten them
    loaded: LoadFacts | None = None  # how the model was loaded, when the caller loaded it (scan)
    share_layers: bool = True  # a simulated forward shares identical layers' work (trace/layer_share.py)

    def __post_init__(self) -> None:
        if self.autocast == "off":
            object.__setattr__(self, "autocast", None)

    @property
    def simulate(self) -> bool:
        return self.placement.simulated

    def with_(self, **changes: Any) -> "TraceRequest":
        return replace(self, **changes)
