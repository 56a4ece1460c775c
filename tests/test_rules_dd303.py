"""DD303 non-finite-values: the first module whose output has NaN/Inf while its inputs were finite."""

from __future__ import annotations

import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import found, load_fixture


class LogOfNegative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.after = nn.Linear(4, 4)

    def forward(self, x):
        return self.after(self.inner(x) - 100).log().sum()


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.bad = LogLayer()
        self.last = nn.Linear(4, 4)

    def forward(self, x):
        return self.last(self.bad(self.first(x)))


class LogLayer(nn.Module):
    def forward(self, x):
        return torch.log(x - 100)


def test_the_first_module_that_made_nan_is_named_not_the_ones_after_it():
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(2, 4)
    with torch.no_grad():
        h = model.first(x)
        assert torch.isfinite(h).all() and torch.isnan(model.bad(h)).all()  # plain PyTorch
    [f] = found(dtype_doctor.diagnose(model, {"x": x}), "DD303")
    assert (f.module, f.module_type, f.severity) == ("bad", "LogLayer", "error")
    assert f.op == "aten.log.default" and "finite inputs" in f.message


def test_masks_made_with_minus_inf_inside_a_model_are_not_reported():
    llama = load_fixture("llama-tiny")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    report = dtype_doctor.diagnose(llama, {"input_ids": ids, "attention_mask": (ids != 0).long()})
    assert not found(report, "DD303") and not found(report, "DD301")


def test_a_nan_loss_under_fp16():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 4)

        def forward(self, x, labels):
            logits = self.body(x)
            var = (logits * 0).var(-1, keepdim=True)  # zero variance
            normed = (logits - logits) / var.sqrt()  # 0/0
            return {"loss": nn.functional.mse_loss(normed, labels)}

    m, x, y = Model().half(), torch.randn(2, 4).half(), torch.randn(2, 4).half()
    assert torch.isnan(m(x, y)["loss"])
    [f] = found(dtype_doctor.diagnose(m, {"x": x, "labels": y}), "DD303")
    assert f.module == "" and f.op == "aten.div.Tensor" and "NaN" in f.message


def test_simulated_traces_do_not_guess():
    model = Chain()
    report = dtype_doctor.diagnose(model, {"x": torch.randn(2, 4)}, simulate=True, device="cuda")
    assert not found(report, "DD303")
    assert not report.trace.values_measured
