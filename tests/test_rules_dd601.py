"""DD601 fsdp-mixed-trainable-dtypes, against FSDP2's own lazy-init check on the fake process group."""

import pytest
import torch

import dtype_doctor
from helpers_fsdp import build, step


def test_fsdp_refuses_mixed_trainable_dtypes_and_dd601_names_the_unit():
    with dtype_doctor.fake_world(4) as mesh:
        model, x = build("mixed-trainable-dtypes", mesh)
        with pytest.raises(AssertionError, match="FSDP expects uniform original parameter dtype"):
            step(model, x)
        model, x = build("mixed-trainable-dtypes", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    [f] = [f for f in report.findings if f.code == "DD601"]
    assert f.module == "0" and f.remedies[0].strategy == "fp32-trainable"
    assert report.target.world.size == 4


def test_frozen_parameters_of_another_dtype_are_allowed():
    """Only trainable parameters count: a frozen bf16 weight beside a trainable fp32 bias runs."""
    with dtype_doctor.fake_world(2) as mesh:
        model, x = build("mixed-trainable-dtypes", mesh)
        model[0].weight.requires_grad_(False)
        step(model, x)  # runs
        model, x = build("mixed-trainable-dtypes", mesh)
        model[0].weight.requires_grad_(False)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert "DD601" not in {f.code for f in report.findings}
