"""DD401 grad-scaler-half-gradients, against the real torch.amp.GradScaler."""

import pytest
import torch
import torch.nn as nn

import dtype_doctor


def scaler_step(model: nn.Module, x: torch.Tensor) -> None:
    """One AMP step as the recipe writes it: autocast(fp16) forward, scaled backward, unscale."""
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def test_fp16_trainable_weights_under_fp16_autocast() -> None:
    model, x = nn.Linear(4, 2).half(), torch.randn(3, 4)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler_step(model, x)
    model.zero_grad(set_to_none=True)
    report = dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16")
    [f] = [f for f in report.findings if f.code == "DD401"]
    assert f.severity == "error" and f.stage == "optimizer"
    assert {t.name for t in f.tensors} == {"weight", "bias"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_what_grad_scaler_accepts_is_not_reported(dtype: torch.dtype) -> None:
    model, x = nn.Linear(4, 2).to(dtype), torch.randn(3, 4)
    scaler_step(model, x)  # runs
    model.zero_grad(set_to_none=True)
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16"))


def test_only_training_with_fp16_autocast_is_judged() -> None:
    model, x = nn.Linear(4, 2).half(), torch.randn(3, 4).half()
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, train=True))  # no AMP: no scaler
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, autocast="float16"))  # inference


def test_bf16_gradients_are_refused_on_a_simulated_cuda_target_only() -> None:
    """The CPU unscale kernel implements bfloat16 (shown by scaler_step above running); the
    CUDA one does not, so a CUDA target with bf16 trainables under fp16 AMP is an error."""
    model, x = nn.Linear(4, 2).to(torch.bfloat16), torch.randn(3, 4)
    scaler_step(model, x)  # runs on this CPU
    model.zero_grad(set_to_none=True)
    report = dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16", simulate=True, device="cuda")
    [f] = [f for f in report.findings if f.code == "DD401"]
    assert "BFloat16" in f.message and f.severity == "error"
