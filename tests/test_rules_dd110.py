"""DD110 half-precision-master-weights: trainable parameters in fp16/bf16 during training."""

import pytest
import torch
import torch.nn as nn

import dtype_doctor


def dd110(report):
    return [f for f in report.findings if f.code == "DD110"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_trainable_parameters_in_training(dtype: torch.dtype) -> None:
    model, x = nn.Linear(4, 2).to(dtype), torch.randn(3, 4).to(dtype)
    # why it matters: a small update on a weight of 1.0 rounds away in half precision
    w = torch.ones((), dtype=dtype)
    assert (w + 1e-4) == w
    [f] = dd110(dtype_doctor.diagnose(model, {"input": x}, train=True))
    assert f.severity == "warning" and f.stage == "model-loading"
    assert f.fixes[0].strategy == "fp32-trainable"


def test_not_reported_for_inference_or_fp32_or_frozen_half_base() -> None:
    half, x = nn.Linear(4, 2).half(), torch.randn(3, 4).half()
    assert not dd110(dtype_doctor.diagnose(half, {"input": x}))  # no training
    assert not dd110(dtype_doctor.diagnose(nn.Linear(4, 2), {"input": x.float()}, train=True))

    class Adapter(nn.Module):  # frozen fp16 base, trainable fp32 adapter under autocast
        def __init__(self) -> None:
            super().__init__()
            self.base = nn.Linear(4, 4).half().requires_grad_(False)
            self.adapter = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.adapter(x)

    report = dtype_doctor.diagnose(Adapter(), {"x": torch.randn(3, 4)}, train=True, autocast="bfloat16")
    assert not dd110(report)
