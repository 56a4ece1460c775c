"""FSDP2 scenarios shared by the in-process (fake process group) tests and the real gloo run
that judges them (tests/test_fsdp_oracle.py)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SCENARIOS = ("correct-policy", "mixed-trainable-dtypes", "uncast-inputs", "bf16-reduce",
             "bf16-loss", "fp32-output-loss", "keep-fp32-frozen", "keep-fp32-declared", "keep-fp32-own-unit")


class WithLoss(nn.Module):
    """A sharded model's logits into cross_entropy, outside the model's units (as a training script computes it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        logits = self.inner(input)
        return F.cross_entropy(logits, torch.arange(logits.shape[0]) % logits.shape[1])


class Normed(nn.Module):
    """A linear, a LayerNorm, a head: the norm is the module kept in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.lin(input)))


def build(scenario: str, mesh) -> tuple[nn.Module, torch.Tensor]:
    """A model sharded per layer and at the root, and its input, for `scenario`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    if scenario.startswith("keep-fp32"):
        return _normed(scenario, mesh), torch.randn(4, 16)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    policy = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}
    if scenario == "mixed-trainable-dtypes":
        model[0].weight.data = model[0].weight.data.to(torch.bfloat16)  # its bias stays float32, in the same unit
    elif scenario == "uncast-inputs":
        policy["cast_forward_inputs"] = False
    elif scenario == "bf16-reduce":
        policy.pop("reduce_dtype")
    elif scenario == "fp32-output-loss":
        policy["output_dtype"] = torch.float32
    mp = MixedPrecisionPolicy(**policy)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if scenario.endswith("-loss"):
        return WithLoss(model), torch.randn(4, 16)
    return model, torch.randn(4, 16)


def _normed(scenario: str, mesh) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = Normed()
    if scenario == "keep-fp32-declared":  # a float32 model that declares its norm float32, as transformers models do
        model._keep_in_fp32_modules = ["norm"]
    else:  # a bf16 model whose norm the user kept in float32
        model.to(torch.bfloat16)
        model.norm.float()
    if scenario == "keep-fp32-frozen":
        model.norm.requires_grad_(False)
    if scenario == "keep-fp32-own-unit":  # the fix: the norm its own unit, computing in fp32 and handing bf16 on
        fully_shard(model.norm, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.bfloat16))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    return model


def step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out.float().sum().backward()
    return out


class TwoShards(nn.Module):
    """Two parameters that FSDP1 flattens into one FlatParameter, [a, b]: on 2 ranks rank 0 holds a, rank 1 holds b."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(8))
        self.b = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.a * x).sum() + (self.b * y).sum()


SCALERS = ("fsdp1-GradScaler", "fsdp1-ShardedGradScaler", "fsdp2-GradScaler")


def scales_after_an_overflow(case: str, mesh) -> list[float]:
    """Every rank's GradScaler scale after one step whose gradient overflows in b (rank 1's shard) only.
    Needs a real process group: the scales are all-gathered."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    wrapper, scaler_class = case.split("-")
    model: nn.Module = TwoShards()
    if wrapper == "fsdp1":
        model = FullyShardedDataParallel(model, use_orig_params=False, device_id=torch.device("cpu"))
    else:
        fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ShardedGradScaler("cpu") if scaler_class == "ShardedGradScaler" else torch.amp.GradScaler("cpu")
    y = torch.ones(8)
    y[7] = 1e38  # b's gradient times the scale (65536) is inf in float32
    scaler.scale(model(torch.ones(8), y)).backward()
    scaler.step(opt)
    scaler.update()
    scales = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(scales, torch.tensor([scaler.get_scale()]))
    return [float(s) for s in scales]
