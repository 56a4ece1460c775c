"""`watch()`: the user's block runs as it would without the doctor, and the report is there
whether or not the block raised."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor

PACKAGE = str(Path(dtype_doctor.__file__).parent)


def _int32_labels_step(model: nn.Module) -> None:
    F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 1], dtype=torch.int32))


def test_a_raising_block_still_raises_and_the_report_is_kept() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(RuntimeError) as plain:
        _int32_labels_step(model)  # what PyTorch does without the doctor

    with pytest.raises(RuntimeError) as raised:
        with dtype_doctor.watch(model) as w:
            _int32_labels_step(model)
    assert type(raised.value) is type(plain.value) and str(raised.value) == str(plain.value)
    # One error, one finding: the rule that owns it, not DD001 beside it.
    assert [(f.code, f.severity) for f in w.report.findings] == [("DD104", "error")]
    assert raised.value.dtype_doctor_report is w.report
    note = "\n".join(raised.value.__notes__)
    assert "DD104" in note and "int32" in note
    frames = [fs.filename for fs in traceback.extract_tb(raised.value.__traceback__)]
    assert frames and not [f for f in frames if f.startswith(PACKAGE)]


def test_a_clean_block_gets_a_clean_report() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    with dtype_doctor.watch(model) as w:
        F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 1]))
    assert w.report.findings == ()
    assert w.report.summary["ops_traced"] > 0


def test_raise_errors_false_repairs_and_runs_on() -> None:
    model = nn.Sequential(nn.Linear(4, 3)).half()
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError):
        model(x)
    with dtype_doctor.watch(model, raise_errors=False) as w:
        out = model(x)
    assert out.shape == (2, 3)
    assert [f.code for f in w.report.findings if f.severity == "error"] == ["DD101"]
