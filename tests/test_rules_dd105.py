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
