"""FSDP2 scenarios shared by the in-process (fake process group) tests and the real gloo run
that judges them (tests/test_fsdp_oracle.py)."""

from __future__ import annotations

import torch
import torch.nn as nn

SCENARIOS = ("correct-policy", "mixed-trainable-dtypes", "uncast-inputs", "bf16-reduce")


def build(scenario: str, mesh) -> tuple[nn.Module, torch.Tensor]:
    """A two-layer model sharded per layer and at the root, and its input, for `scenario`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    policy = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    if scenario == "mixed-trainable-dtypes":
        model[0].weight.data = model[0].weight.data.to(torch.bfloat16)  # its bias stays float32, in the same unit
    elif scenario == "uncast-inputs":
        policy["cast_forward_inputs"] = False
    elif scenario == "bf16-reduce":
        policy.pop("reduce_dtype")
    mp = MixedPrecisionPolicy(**policy)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model, torch.randn(4, 16)


def step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).float().sum().backward()
