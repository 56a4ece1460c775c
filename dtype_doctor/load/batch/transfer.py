"""The transfer stage: ``batch.to(device)`` as ``Trainer`` does before the forward; with
``--simulate``, fake tensors where a simulated tensor on the target device lives
(machine.home; no data copied), named in the lineage by the device the step asked for."""

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
            moved = _simulated(t, dev, fake_mode)
            step = value_step("transfer", moved, f".to({dev}) as a fake tensor (--simulate: no data copied)", device=str(dev))
        else:
            moved = t.to(dev)
            step = value_step("transfer", moved, f".to({dev})" if t.device != dev else f"already on {dev}")
        out[key] = moved
        state = state.step(key, step)
    return state.but(inputs=out)


def _simulated(t: Any, dev: Any, fake_mode: Any) -> Any:
    """`t` as a fake tensor where a simulated tensor on `dev` lives (machine.home)."""
    from torch._subclasses.fake_tensor import FakeTensor

    from dtype_doctor.machine.home import simulated_home

    with fake_mode:
        return (t if isinstance(t, FakeTensor) else fake_mode.from_tensor(t)).to(simulated_home(dev, fakes_cuda=True))
