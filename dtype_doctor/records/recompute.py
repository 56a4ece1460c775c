"""Activation checkpointing's recompute, compared with the forward it replays (trace/recompute.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.trace import SourceLoc


@dataclass(frozen=True, slots=True)
class RecomputeDiff:
    """The first op of a checkpointed region whose recomputed output differs from the forward's:
    the op, its output in each (dtype, shape, device), the autocast each ran under ("cpu:bfloat16",
    None: none), its floating inputs' dtypes in each, and PyTorch's CheckpointError when it raised."""

    region: str  # the checkpointed function: "Block" (a module), "MyModel.block_fn" (a function)
    source: SourceLoc | None  # the user's line that ran the checkpointed region (the model call, for a library's)
    op: str
    index: int  # the op's place in the region's forward
    forward: str  # "bfloat16[4, 8] cpu"
    recomputed: str
    forward_autocast: str | None
    recompute_autocast: str | None
    forward_inputs: tuple[str, ...]
    recompute_inputs: tuple[str, ...]
    raised: str | None = None  # PyTorch's CheckpointError, its first lines

    @property
    def policy_differs(self) -> bool:
        return self.forward_autocast != self.recompute_autocast

    def to_dict(self) -> dict[str, Any]:
        return {"region": self.region, "source": self.source.to_dict() if self.source else None, "op": self.op,
                "index": self.index, "forward": self.forward, "recomputed": self.recomputed,
                "forward_autocast": self.forward_autocast, "recompute_autocast": self.recompute_autocast,
                "forward_inputs": list(self.forward_inputs), "recompute_inputs": list(self.recompute_inputs),
                "raised": self.raised}


@dataclass(frozen=True, slots=True)
class Recompute:
    """The step's checkpointed regions: how many ran forward, how many were recomputed, and each difference."""

    regions: int
    recomputed: int
    diffs: tuple[RecomputeDiff, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"regions": self.regions, "recomputed": self.recomputed, "differences": [d.to_dict() for d in self.diffs]}
