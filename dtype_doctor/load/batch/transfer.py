"""The transfer stage: ``batch.to(device)`` as ``Trainer`` does before the forward; with
``--simulate``, fake tensors on the target device (no data copied)."""

from __future__ import annotations

from typing import Any

from dtype_doctor.load.batch.describe import value_step
from dtype_doctor.load.batch.state import BatchContext, BatchState


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    import torch

    assert state.inputs is not None
    fake_mode = getattr(ctx.loaded, "fake_mode", None)
    dev = torch.device(ctx.device)  # the Placement's device, decided at the entry
    out: dict[str, Any] = {}
    for key, t in state.inputs.items():
        if not isinstance(t, torch.Tensor):
            out[key] = t
            continue
        if fake_mode is not None:
            from torch._subclasses.fake_tensor import FakeTensor

            with fake_mode:
                moved = (t if isinstance(t, FakeTensor) else fake_mode.from_tensor(t)).to(dev)
            detail = f".to({dev}) as a fake tensor (--simulate: no data copied)"
        else:
            moved = t.to(dev)
            detail = f".to({dev})" if t.device != dev else f"already on {dev}"
        out[key] = moved
        state = state.step(key, value_step("transfer", moved, detail))
    return state.but(inputs=out)
