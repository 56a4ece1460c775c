"""DD001 trace-failed: the forward stopped for a reason the doctor cannot step over."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import found, located


class WrongShape(nn.Module):
    def __init__(self, first_dtype=torch.float32):
        super().__init__()
        self.a = nn.Linear(8, 4).to(first_dtype)
        self.b = nn.Linear(8, 2)  # expects 8 features, gets 4

    def forward(self, x):
        return self.b(self.a(x).float())


@pytest.mark.parametrize("simulate", [False, True])
def test_shape_error_is_reported_as_such(simulate):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="cannot be multiplied") as real:
        WrongShape()(x)
    report = dtype_doctor.diagnose(WrongShape(), {"x": x}, simulate=simulate, device="cpu")
    [f] = report.findings
    assert (f.code, f.severity, f.module, f.module_type) == ("DD001", "error", "b", "Linear")
    assert f.op == "aten.addmm.default"
    assert "not dtype or device" in f.message
    assert report.trace.failure.kind == "other" and report.trace.failure.module == "b"
    if not simulate:
        assert f.pytorch_error == str(real.value)  # PyTorch's own words, unchanged


def test_findings_before_the_failure_are_kept():
    """The fp16 layer is stepped over and reported; the shape error after it ends the trace."""
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        WrongShape(torch.float16)(x)  # PyTorch shows only the first problem
    report = dtype_doctor.diagnose(WrongShape(torch.float16), {"x": x})
    assert located(report, {"DD101", "DD001"}) == {("DD101", "a"), ("DD001", "b")}


def test_missing_input_fails_at_the_model_boundary():
    report = dtype_doctor.diagnose(WrongShape(), {"y": torch.randn(2, 8)})
    [f] = found(report, "DD001")
    assert f.module == "" and f.module_type == "WrongShape"
    assert "unexpected keyword argument 'y'" in f.message
    assert report.trace.failure.kind == "other"


def test_clean_trace_has_no_dd001():
    class Fine(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 2)

        def forward(self, x):
            return self.lin(x)

    report = dtype_doctor.diagnose(Fine(), {"x": torch.randn(2, 8)})
    assert report.findings == () and report.trace.failure is None


def test_data_dependent_op_under_simulation():
    class Select(nn.Module):
        def forward(self, x):
            return x[x > 0].sum()

    Select()(torch.randn(6))  # runs on real tensors
    report = dtype_doctor.diagnose(Select(), {"x": torch.randn(6)}, simulate=True, device="cpu")
    assert report.trace.failure.kind == "simulation"
    [f] = found(report, "DD001")
    assert "could not be simulated" in f.message
    assert f.severity == "warning"  # a limit of --simulate, not a fault in the user's pipeline
