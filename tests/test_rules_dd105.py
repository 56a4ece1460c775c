"""DD105 float64-in-pipeline: a float64 tensor reaches the model or the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from helpers_models import found, load_fixture


@pytest.fixture(scope="module")
def wav2vec2():
    return load_fixture("wav2vec2-tiny")


def test_float64_input_values_into_wav2vec2(wav2vec2):
    audio = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 4000)))  # numpy: float64
    assert audio.dtype == torch.float64
    with pytest.raises(RuntimeError, match="Double"):
        wav2vec2(input_values=audio)

    report = dtype_doctor.diagnose(wav2vec2, {"input_values": audio})
    [f] = found(report, "DD105")
    assert (f.severity, f.module, f.stage) == ("warning", "", "collator")
    assert [(t.name, t.dtype) for t in f.tensors] == [("input_values", "float64")]
    assert "float32" in f.message
    # The failure itself is the first conv's DD101; float64 is why.
    [mismatch] = found(report, "DD101")
    assert mismatch.module == "wav2vec2.feature_extractor.conv_layers.0.conv"


def test_float32_input_values_are_clean(wav2vec2):
    audio = torch.randn(2, 4000)
    wav2vec2(input_values=audio)
    assert dtype_doctor.diagnose(wav2vec2, {"input_values": audio}).findings == ()


class Tabular(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, features, target=None):
        pred = self.mlp(features).squeeze(-1)
        return pred if target is None else F.mse_loss(pred, target)


def test_float64_features():
    features = torch.from_numpy(np.ones((3, 5)))
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        Tabular()(features)
    report = dtype_doctor.diagnose(Tabular(), {"features": features})
    assert [f.tensors[0].name for f in found(report, "DD105")] == ["features"]
    assert [f.module for f in found(report, "DD101")] == ["mlp.0"]


def test_float64_created_in_model_code_reaching_the_loss():
    class Model(Tabular):
        def forward(self, features):
            target = torch.from_numpy(np.arange(3.0))  # float64, made inside forward
            return F.mse_loss(self.mlp(features).squeeze(-1), target)

    features = torch.randn(3, 5)
    assert Model()(features).dtype == torch.float64  # runs, silently in double
    [f] = found(dtype_doctor.diagnose(Model(), {"features": features}), "DD105")
    assert (f.stage, f.op, f.severity) == ("model-code", "aten.mse_loss.default", "warning")
    assert [t.role for t in f.tensors] == ["target"]


def test_float32_pipeline_is_clean():
    features, target = torch.randn(3, 5), torch.randn(3)
    Tabular()(features, target)
    assert dtype_doctor.diagnose(Tabular(), {"features": features, "target": target}).findings == ()


def test_a_float64_model_is_meant_to_compute_in_float64() -> None:
    model, x = nn.Linear(4, 2).double(), torch.randn(3, 4, dtype=torch.float64)
    model(x)  # runs
    assert [f for f in dtype_doctor.diagnose(model, {"input": x}).findings if f.code == "DD105"] == []


def test_float64_ids_get_the_dtype_their_consumer_needs() -> None:
    """One answer to "what dtype must this operand have": DD105 agrees with DD103."""
    bert = load_fixture("bert-tiny")
    ids = torch.tensor([[101.0, 7592.0, 102.0]], dtype=torch.float64)
    report = dtype_doctor.diagnose(bert, {"input_ids": ids})
    by_input = {f.tensors[0].name: f for f in found(report, "DD105")}
    assert {r.to for r in by_input["input_ids"].remedies} == {"int64"}
    assert "used as indices, which must be int64" in by_input["input_ids"].message
    assert {r.to for f in found(report, "DD103") for r in f.remedies} == {"int64"}


def test_float64_class_targets_are_made_int64_not_float32() -> None:
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(5, 4)

        def forward(self, features, labels):
            return F.cross_entropy(self.head(features), labels)

    labels = torch.from_numpy(np.array([0.0, 2.0, 3.0]))  # float64 class indices
    report = dtype_doctor.diagnose(Classifier(), {"features": torch.randn(3, 5), "labels": labels})
    [f] = [f for f in found(report, "DD105") if f.tensors[0].name == "labels"]
    assert {r.to for r in f.remedies} == {"int64"} and "a loss target, which must be int64" in f.message
