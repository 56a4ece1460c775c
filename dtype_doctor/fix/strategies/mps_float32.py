"""mps-float32: a float64 tensor cast to float32 where it enters, before its copy to Apple's MPS device.

MPS has no float64 and a Mac refuses the copy itself (DD120, machine/mps_expectations.py
FLOAT64_ERROR), so a cast at the model call, after `x.to("mps")`, comes too late: the step
never reaches it. DD120 names two places for each input that reaches mps as float64: the line
that made it float64 (`torch.from_numpy(features)`) and the line of its copy (`x.to(device)`).
The cast goes on the first that takes it (codemods.mps.CastBeforeMove); `fix --run` verifies by
running the script again under the same `--simulate --device mps`. In memory (`fix MODEL DATASET`)
the input is cast to float32 before the trace moves it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, inputs_cast, listed, resolve
from dtype_doctor.records import Finding, Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt

# Where a copy's line holds several moves (`x, y = x.to(device), y.to(device)`), each is tried in turn:
# the re-run keeps the one that clears the finding and takes back one that casts the wrong tensor.
MOVES_TRIED = 3


class MpsFloat32(
    Strategy, name="mps-float32", applicability=SAFE, rank=11,
    summary="cast a float64 tensor to float32 where it enters, before its copy to mps (a Mac refuses the copy)",
):
    at_entry = True

    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        names = listed(sorted({r.target for r in remedies}))
        lines = listed([f"{r.source.file}:{r.source.line}" for r in remedies if r.source])
        return f"cast {names} to float32 before it is copied to mps" + (f" (at {lines})" if lines else "")

    def describe(self, c: Change) -> str:
        where = f" at {c.source.file}:{c.source.line}" if c.source else ""
        return f"cast {c.target} {c.before or 'float64'} → {c.to}{where}, before its copy to mps"

    def script_changes(self, finding: Finding, remedies: Sequence[Remedy], report: Report, ctx: Context) -> tuple[Change, ...]:
        """One change a place, in the rule's order (where the dtype was made, then the copy): the
        base keeps one change a target, and this fix has two places to try for one target."""
        if not remedies:
            raise Skip(f"{finding.code} names no {self.name} remedy")
        changes = {(r.target, r.source): Change(self.name, r.target, r.to, "float64", r.stage, r.source) for r in remedies}
        return tuple(changes.values())

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        from dtype_doctor.machine.mps_expectations import NEVER
        from dtype_doctor.numerics import dtype_name

        changes = {}
        for r in self.remedies(report, ctx):
            value = pipeline.inputs.get(r.target)
            if isinstance(value, torch.Tensor) and dtype_name(value.dtype) in NEVER:
                changes.setdefault(r.target, Change(self.name, r.target, r.to, dtype_name(value.dtype), r.stage, r.source))
        if not changes:
            raise Skip("no model input in the batch is float64 (it is made in model code, or cast already)")
        return tuple(changes.values())

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        return inputs_cast(pipeline, changes)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix.codemods.mps import CastBeforeMove
        from dtype_doctor.fix.patches import Attempt

        file = resolve(c.source)
        if file is None or c.source is None:
            return []
        line = c.source.line
        return [Attempt(file, CastBeforeMove(line, c.to)),
                *(Attempt(file, CastBeforeMove(line, c.to, nth=i)) for i in range(MOVES_TRIED))]
