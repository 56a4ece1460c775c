"""DD605 fsdp-half-precision-loss: cross_entropy on a fully_shard unit's bf16 output, as FSDP2 returns it."""

import dtype_doctor
from helpers_fsdp import build, step
from helpers_models import codes


def test_unset_output_dtype_gives_a_bf16_loss_and_dd605_names_the_unit():
    with dtype_doctor.fake_world(2) as mesh:
        assert str(step(*build("bf16-loss", mesh)).dtype) == "torch.bfloat16"  # plain PyTorch: runs, a bf16 loss
        model, x = build("bf16-loss", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    [f] = [f for f in report.findings if f.code == "DD605"]
    assert "fully_shard(inner)" in f.message and f.stage == "loss" and f.op.startswith("aten.nll_loss")
    assert "DD112" not in codes(report)  # the half loss is DD605's, which names the policy behind it


def test_output_dtype_float32_is_clean():
    with dtype_doctor.fake_world(2) as mesh:
        assert str(step(*build("fp32-output-loss", mesh)).dtype) == "torch.float32"
        report = dtype_doctor.diagnose(*_inputs(build("fp32-output-loss", mesh)), train=True)
    assert "DD605" not in codes(report)


def _inputs(built):
    model, x = built
    return model, {"input": x}


def test_a_head_outside_every_unit_is_not_blamed_on_a_layers_unit():
    """A bf16 model whose first layer alone is sharded: its head makes the bf16 logits itself, so no unit's
    output_dtype would change them, and DD605 names none (the bf16 loss is the model's own dtype)."""
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from helpers_fsdp import WithLoss

    with dtype_doctor.fake_world(2) as mesh:
        torch.manual_seed(0)
        inner = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).bfloat16()
        fully_shard(inner[0], mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        model, x = WithLoss(inner), torch.randn(4, 16, dtype=torch.bfloat16)
        assert str(step(model, x).dtype) == "torch.bfloat16"  # plain PyTorch: a bf16 loss all the same
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert "DD605" not in codes(report)
