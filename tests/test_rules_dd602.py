"""DD602 fsdp-uncast-inputs, against the real first matmul on the fake process group."""

import pytest

import dtype_doctor
from helpers_fsdp import build, step


def test_uncast_inputs_fail_the_first_matmul_and_dd602_says_why():
    with dtype_doctor.fake_world(2) as mesh:
        model, x = build("uncast-inputs", mesh)
        with pytest.raises(RuntimeError):
            step(model, x)
        model, x = build("uncast-inputs", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
        assert [f.module for f in report.findings if f.code == "DD602"] == [""]
        model, x = build("uncast-inputs", mesh)
        report = dtype_doctor.diagnose(model, {"input": x.bfloat16()}, train=True)  # already in param_dtype
    assert "DD602" not in {f.code for f in report.findings}
