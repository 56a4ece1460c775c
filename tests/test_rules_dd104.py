"""DD104 loss-target-dtype: a loss target the loss rejects (error) or silently reinterprets (warning)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from helpers_models import found, load_fixture, token_batch


@pytest.fixture(scope="module")
def classifier():
    model = load_fixture("bert-tiny")  # 3 labels: cross_entropy
    # transformers infers problem_type on the first forward and stores it in the config (uint8
    # labels alone would route to multi-label BCE); fixed here so test order does not matter.
    model.config.problem_type = "single_label_classification"
    return model


@pytest.fixture(scope="module")
def regressor():
    return load_fixture("bert-tiny-regression")  # num_labels=1, problem_type="regression": mse


@pytest.mark.parametrize("simulate", [False, True])
def test_int32_class_labels_are_an_error(classifier, simulate):
    batch = {**token_batch(), "labels": torch.tensor([0, 2], dtype=torch.int32)}
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Int"):
        classifier(**batch)
    report = dtype_doctor.diagnose(classifier, batch, simulate=simulate, device="cpu")
    [f] = found(report, "DD104")
    assert f.severity == "error"
    assert f.module == ""  # BertForSequenceClassification computes its loss in its own forward
    assert f.op == "aten.nll_loss_forward.default"
    assert f.stage == "collator"
    assert {(t.role, t.name, t.dtype) for t in f.tensors if t.role == "target"} == {("target", "labels", "int32")}
    assert [x.strategy for x in f.fixes] == ["cast-inputs"]
    assert report.trace.failure is None


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64])
def test_uint8_and_int64_class_labels_are_accepted(classifier, dtype):
    batch = {**token_batch(), "labels": torch.tensor([0, 2], dtype=dtype)}
    assert torch.isfinite(classifier(**batch).loss)
    assert dtype_doctor.diagnose(classifier, batch).findings == ()


def test_int_labels_routed_to_regression_are_a_warning(regressor):
    """num_labels=1: star ratings 1-5 become mse targets. PyTorch says nothing."""
    batch = {**token_batch(), "labels": torch.tensor([1, 5])}
    out = regressor(**batch)  # silently succeeds ...
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert out.logits.shape == (2, 1)  # ... as a regression
    [f] = found(dtype_doctor.diagnose(regressor, batch), "DD104")
    assert (f.severity, f.op) == ("warning", "aten.mse_loss.default")
    assert "int64" in f.message and "regression" in f.message


def test_float64_regression_targets_are_a_warning(regressor):
    batch = {**token_batch(), "labels": torch.tensor([1.0, 5.0], dtype=torch.float64)}
    assert regressor(**batch).loss.dtype == torch.float64  # the loss silently widened
    report = dtype_doctor.diagnose(regressor, batch)
    [f] = found(report, "DD104")
    assert f.severity == "warning" and "float64" in f.message and "float32" in f.message
    assert [x.code for x in report.findings if x.severity == "error"] == []


def test_matching_float_regression_targets_are_clean(regressor):
    batch = {**token_batch(), "labels": torch.tensor([1.0, 5.0])}
    regressor(**batch)
    assert dtype_doctor.diagnose(regressor, batch).findings == ()


class Head(nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.loss = loss

    def forward(self, x, y):
        logits = self.lin(x)
        if self.loss == "ce":
            return F.cross_entropy(logits, y)
        if self.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits, y)
        return F.mse_loss(logits, y)


@pytest.mark.parametrize(
    "loss,target,match",
    [
        ("bce", torch.randint(0, 2, (2, 3)), "can't be cast to the desired output type Long"),
        ("bce", torch.randint(0, 2, (2, 3)).bool(), "bool"),
        ("ce", torch.tensor([0.0, 2.0]), "expected target dtype to be Long or Byte, but got Float"),
        ("ce", torch.tensor([0, 2], dtype=torch.int16), "but got Short"),
    ],
    ids=["bce-int64", "bce-bool", "ce-float-indices", "ce-int16"],
)
def test_rejected_targets(loss, target, match):
    model, x = Head(loss), torch.randn(2, 4)
    with pytest.raises(RuntimeError, match=match):
        model(x, target)
    for simulate in (False, True):
        [f] = found(dtype_doctor.diagnose(model, {"x": x, "y": target}, simulate=simulate, device="cpu"), "DD104")
        assert f.severity == "error"


@pytest.mark.parametrize(
    "loss,target",
    [
        ("ce", torch.softmax(torch.randn(2, 3), -1)),  # class probabilities
        ("ce", torch.softmax(torch.randn(2, 3), -1).half()),
        ("bce", torch.rand(2, 3)),
        ("mse", torch.randn(2, 3)),
    ],
    ids=["ce-probs", "ce-probs-fp16", "bce-float", "mse-float"],
)
def test_accepted_targets_without_a_warning(loss, target):
    model, x = Head(loss), torch.randn(2, 4)
    model(x, target)
    assert found(dtype_doctor.diagnose(model, {"x": x, "y": target}), "DD104") == []


def test_integer_one_hot_targets_into_cross_entropy():
    model, x = Head("ce"), torch.randn(2, 4)
    one_hot = F.one_hot(torch.tensor([0, 2]), 3)  # int64, same shape as the logits
    with pytest.raises(RuntimeError, match="Expected floating point type for target with class probabilities"):
        model(x, one_hot)
    [f] = found(dtype_doctor.diagnose(model, {"x": x, "y": one_hot}), "DD104")
    assert f.severity == "error"
