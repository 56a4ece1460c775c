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


def test_output_dtype_float32_is_clean():
    with dtype_doctor.fake_world(2) as mesh:
        assert str(step(*build("fp32-output-loss", mesh)).dtype) == "torch.float32"
        report = dtype_doctor.diagnose(*_inputs(build("fp32-output-loss", mesh)), train=True)
    assert "DD605" not in codes(report)


def _inputs(built):
    model, x = built
    return model, {"input": x}
