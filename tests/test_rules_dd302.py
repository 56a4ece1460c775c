"""DD302 fp16-underflow-risk: gradients below fp16's smallest normal, with and without GradScaler."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.records import FP16_TINY
from helpers_models import found


class SmallLoss(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.scale = nn.Linear(64, 64), scale

    def forward(self, x):
        return {"loss": self.body(x).square().mean() * self.scale}


X = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))


def test_fp16_gradients_underflow_without_scaling():
    model = SmallLoss(1e-6)
    half = copy.deepcopy(model).half()
    half(X.half())["loss"].backward()
    grads = torch.cat([p.grad.flatten().float() for p in half.parameters()])
    assert (grads == 0).float().mean() > 0.5  # plain PyTorch: most gradients flushed to zero
    report = dtype_doctor.diagnose(copy.deepcopy(model).half(), {"x": X.half()}, train=True)
    [f] = found(report, "DD302")
    assert f.severity == "warning" and "without loss scaling" in f.message
    mild = copy.deepcopy(SmallLoss(1e-3)).half()  # some gradients survive, many are subnormal
    [g] = found(dtype_doctor.diagnose(mild, {"x": X.half()}, train=True), "DD302")
    assert "below float16's smallest normal" in g.message or "flushed" in g.message


def test_fp16_autocast_with_gradscaler_is_silent_when_scaling_rescues_them():
    model = SmallLoss(1e-3)
    report = dtype_doctor.diagnose(model, {"x": X}, train=True, autocast="float16")
    assert report.trace.grad_scaler
    assert not found(report, "DD302")


def test_fp32_and_bf16_training_are_silent():
    grads = [g.stats for g in dtype_doctor.diagnose(SmallLoss(1e-6), {"x": X}, train=True).trace.grads]
    assert all(s.below_fp16_normal > 0.5 for s in grads)  # tiny gradients, but float32 keeps them
    assert not found(dtype_doctor.diagnose(SmallLoss(1e-6), {"x": X}, train=True), "DD302")
    assert not found(dtype_doctor.diagnose(SmallLoss(1e-6), {"x": X}, train=True, autocast="bfloat16"), "DD302")
    assert FP16_TINY * 2**16 > 1  # GradScaler's first scale lifts 6e-5 gradients well above it


def test_ordinary_gradients_are_silent():
    assert not found(dtype_doctor.diagnose(SmallLoss(1.0), {"x": X}, train=True), "DD302")
    assert not found(dtype_doctor.diagnose(SmallLoss(1.0), {"x": X}), "DD302")
