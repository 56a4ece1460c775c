"""DD606 fsdp-keep-fp32-cast: a norm kept in float32 inside a bf16 fully_shard unit computes in bf16."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dtype_doctor
from helpers_fsdp import build, step
from helpers_models import codes


class _NormWeights(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.native_layer_norm.default:
            self.dtypes.add(args[2].dtype)
        return func(*args, **(kwargs or {}))


def norm_dtypes(scenario: str, mesh) -> set[torch.dtype]:
    spy = _NormWeights()
    with spy:
        step(*build(scenario, mesh))
    return spy.dtypes


@pytest.mark.parametrize("scenario", ["keep-fp32-frozen", "keep-fp32-declared"])
def test_the_fp32_norm_runs_in_bf16_and_dd606_says_so(scenario):
    with dtype_doctor.fake_world(2) as mesh:
        assert norm_dtypes(scenario, mesh) == {torch.bfloat16}  # plain PyTorch: no error, bf16 weights
        model, x = build(scenario, mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    [f] = [f for f in report.findings if f.code == "DD606"]
    assert f.module == "norm" and "MixedPrecisionPolicy(param_dtype=torch.float32" in f.fixes[0].description


def test_its_own_unit_keeps_fp32_and_a_trainable_fp32_norm_is_dd601s():
    with dtype_doctor.fake_world(2) as mesh:
        assert norm_dtypes("keep-fp32-own-unit", mesh) == {torch.float32}
        model, x = build("keep-fp32-own-unit", mesh)
        assert "DD606" not in codes(dtype_doctor.diagnose(model, {"input": x}, train=True))
        model, x = build("keep-fp32-trainable", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert "DD601" in codes(report) and "DD606" not in codes(report)


def test_trainable_fp32_adapters_on_a_frozen_bf16_base_are_mixed_precision_not_dd606():
    """fp32 master weights computing in param_dtype is what a MixedPrecisionPolicy is for."""
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with dtype_doctor.fake_world(2) as mesh:
        model = nn.Sequential(nn.Linear(16, 16).to(torch.bfloat16).requires_grad_(False), nn.Linear(16, 4))  # adapter-like fp32 head
        fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
        report = dtype_doctor.diagnose(model, {"input": torch.randn(4, 16)}, train=True)
    assert "DD606" not in codes(report) and "DD601" not in codes(report)
