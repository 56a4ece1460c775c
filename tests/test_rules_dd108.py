"""DD108 implicit-cast: the model casts one of its inputs to another floating dtype itself (info)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import load_fixture


class CastsItsInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3).half()
        self.head = nn.Linear(4, 2).half()

    def forward(self, pixel_values):
        x = self.stem(pixel_values.to(self.stem.weight.dtype))
        return self.head(x.mean((-1, -2)))


def test_model_that_casts_pixel_values_itself():
    pixels = torch.randn(2, 3, 8, 8)
    assert CastsItsInput()(pixels).dtype == torch.float16  # runs
    report = dtype_doctor.diagnose(CastsItsInput(), {"pixel_values": pixels})
    [f] = report.findings
    assert (f.code, f.severity, f.module, f.op) == ("DD108", "info", "", "aten._to_copy.default")
    assert [(t.name, t.dtype) for t in f.tensors] == [("pixel_values", "float32"), (None, "float16")]
    assert f.stage == "collator"
    assert [x.strategy for x in f.fixes] == ["cast-inputs"]


def test_no_cast_no_finding():
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float16)
    CastsItsInput()(pixels)
    assert dtype_doctor.diagnose(CastsItsInput(), {"pixel_values": pixels}).findings == ()


def test_casts_of_activations_are_the_models_business():
    class Upcasts(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).double().softmax(-1).float()

    Upcasts()(torch.randn(2, 4))
    assert dtype_doctor.diagnose(Upcasts(), {"x": torch.randn(2, 4)}).findings == ()


@pytest.fixture(scope="module")
def vit_half():
    return load_fixture("vit-tiny", dtype=torch.float16)


def test_fp32_pixel_values_into_half_vit(vit_half):
    pixels = torch.randn(2, 3, 32, 32)
    assert vit_half(pixel_values=pixels).logits.dtype == torch.float16  # ViT casts them itself
    report = dtype_doctor.diagnose(vit_half, {"pixel_values": pixels})
    assert [(f.code, f.severity) for f in report.findings] == [("DD108", "info")]
    assert report.findings[0].module.startswith("vit")
    assert "float32" in report.findings[0].message and "float16" in report.findings[0].message
    assert report.at_or_above("warning") == ()
