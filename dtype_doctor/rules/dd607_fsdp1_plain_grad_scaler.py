"""DD607: FSDP1 with a plain GradScaler, whose inf check sees only this rank's shard of the gradients."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

# torch's own GradScaler classes (a subclass of one is the user's, and may reduce found_inf itself).
PLAIN = frozenset({"torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler"})


def check(trace: Trace) -> Iterator[Finding]:
    world = trace.world
    if world is None or world.size < 2 or world.strategy != "fsdp" or trace.scaler not in PLAIN:
        return
    yield RULE.finding(
        f"the step scales its loss with {trace.scaler.rsplit('.', 1)[-1]} while FSDP1 shards the gradients over "
        f"{world.size} ranks: each rank checks only its own shard for inf/nan and nothing reduces the answer, so where one "
        "rank's shard overflows it skips the step and halves its scale while the others step; the ranks' scales then differ, "
        "and the next reduce-scatter sums gradients scaled differently",
        module_type=trace.model.class_name,
        stage="optimizer",
        hints=("from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler; scaler = ShardedGradScaler()",),
    )


RULE = Rule(
    code="DD607",
    name="fsdp1-plain-grad-scaler",
    severity="warning",
    summary="torch.amp.GradScaler with FSDP1 (FullyShardedDataParallel) over several ranks, instead of ShardedGradScaler.",
    why=(
        "GradScaler.unscale_ looks for inf/nan in the gradients it is given. Under FSDP1 each rank holds a shard of each "
        "FlatParameter's gradient, and GradScaler never all-reduces found_inf: an overflow in one rank's shard makes that "
        "rank alone skip its step and back off its scale. ShardedGradScaler all-reduces found_inf over the process group. "
        "FSDP2 needs no ShardedGradScaler: its gradients are DTensors, whose dispatch of "
        "_amp_foreach_non_finite_check_and_unscale_ reduces found_inf across the mesh."
    ),
    example=(
        "model = FSDP(model); scaler = torch.amp.GradScaler()\n"
        "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()\n"
        "# an inf in rank 1's shard only: rank 0's scale stays 65536.0, rank 1's becomes 32768.0"
    ),
    fix="Use torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler with FSDP1 (accelerate and Trainer do).",
    fix_safety="display-only: the scaler is in your training loop.",
    check=check,
    device_note="Judged from the step's GradScaler class and the model's FSDP1 wrapping; the same with NCCL and gloo.",
)
