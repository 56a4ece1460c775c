"""DD116: activation checkpointing's recompute makes a tensor of another dtype than the forward did.

Non-reentrant checkpointing runs a region again in the backward and compares the tensors the two
runs saved: a dtype that differs raises CheckpointError ("Recomputed values for the following
tensors have different metadata than during the forward pass", torch/utils/checkpoint.py,
check_recomputed_tensors_match). Checkpoint saves the autocast state at the region's entry and
restores it for the recompute; a policy it does not see differs: an autocast entered inside the
region by a flag set around the forward only, FSDP2's mixed-precision input cast that its
recompute skipped (pytorch#148831, fixed in torch 2.13), a default dtype changed between the two.
The rule reads the recompute traced beside the forward (trace/recompute.py) and names the first
torch function whose output differs and the autocast each ran under. Where no saved tensor
differs, PyTorch does not raise, and the gradients come from activations of another dtype than
the forward's: a warning.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.records.recompute import RecomputeDiff
from dtype_doctor.rules.base import Rule


def _ran(autocast: str | None) -> str:
    if autocast is None:
        return "outside autocast"
    device, _, dtype = autocast.partition(":")
    return f"under autocast({device}, {dtype})"


def _why(d: RecomputeDiff) -> tuple[str, str]:
    if d.policy_differs:
        return (f"the forward ran it {_ran(d.forward_autocast)}, the recompute {_ran(d.recompute_autocast)}",
                "apply the precision policy where checkpoint sees it: enter torch.autocast around the call that runs the "
                "checkpointed region (checkpoint saves it and restores it for the recompute), not by state the "
                "recompute does not share (a flag or context set around the forward only)")
    return (f"both ran {_ran(d.forward_autocast)}, and its inputs were {', '.join(d.forward_inputs) or 'none floating'} in the "
            f"forward and {', '.join(d.recompute_inputs) or 'none floating'} in the recompute: a cast applied to the "
            "forward's inputs only (FSDP2's MixedPrecisionPolicy before torch 2.13, a hook that skips the recompute)",
            "cast the region's inputs inside the checkpointed function, or wrap the layer with checkpoint_wrapper before "
            "fully_shard so the recompute runs FSDP2's cast too")


def check(trace: Trace) -> Iterator[Finding]:
    facts = trace.recompute
    if facts is None:
        return
    for d in facts.diffs:
        why, hint = _why(d)
        where = f" (checkpointed at {d.source.file}:{d.source.line})" if d.source else ""
        outcome = ("PyTorch compares the tensors both saved and raises CheckpointError" if d.raised else
                   "no saved tensor differs, so PyTorch does not raise: the gradients come from activations of another "
                   "dtype than the forward's")
        yield RULE.finding(
            f"The recompute of {d.region}{where} made {d.op} → {d.recomputed} where the forward made {d.forward}: "
            f"{why}. {outcome}.",
            severity="error" if d.raised else "warning", module_type=d.region, op=d.op, stage="model-code", source=d.source,
            pytorch_error=d.raised, hints=(hint,))


def explains(trace: Trace) -> bool:
    return trace.recompute is not None and any(d.raised for d in trace.recompute.diffs)


RULE = Rule(
    code="DD116",
    name="recompute-dtype-differs",
    severity="error",
    summary="Activation checkpointing's recompute makes a tensor of another dtype than the forward (CheckpointError).",
    why=(
        "Non-reentrant activation checkpointing runs each region again in the backward and requires the tensors it "
        "saves to match the forward's. A precision policy the recompute does not share (an autocast entered by state "
        "set around the forward only, FSDP2's mixed-precision input cast skipped while recomputing) makes them differ, "
        "and the backward stops with CheckpointError; where no saved tensor differs, the gradients silently come from "
        "activations of another dtype."
    ),
    example="with mixed_precision(model):  # sets a flag the block's forward reads to enter autocast\n"
            "    loss = model(x).sum()     # the block is checkpointed (use_reentrant=False)\n"
            "loss.backward()  # CheckpointError: Recomputed values ... have different metadata than during the forward pass",
    fix="Enter torch.autocast around the call that runs the checkpointed region (checkpoint restores it for the "
        "recompute); cast a region's inputs inside it; with FSDP2, torch 2.13 or checkpoint_wrapper before fully_shard.",
    fix_safety="display-only: where the precision policy belongs is the script's design.",
    check=check,
    explains=explains,
    references=("https://github.com/pytorch/pytorch/issues/148831", "https://github.com/pytorch/pytorch/pull/176650",
                "https://github.com/pytorch/pytorch/issues/141896", "https://github.com/pytorch/pytorch/issues/159359"),
    device_note="The same on every device: checkpoint's own metadata check, before any kernel of the backward.",
)
