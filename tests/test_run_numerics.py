"""`run` measures values by default: DD301-DD303 speak about the user's own step, and gradients are
measured at backward, before the user's GradScaler unscales them, with its scale known.

PyTorch is the oracle: the overflow DD301 names is an inf the plain forward really produces.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    return exit_info.value.code, json.loads(capsys.readouterr().out)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


OVERFLOW = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8) * 1e5  # raw sensor units, never normalised
for step in range(2):
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    print("finite", bool(torch.isfinite(out).all()))
    out.float().sum().backward()
    optimizer.step()
"""


def test_run_measures_values_and_names_the_overflowing_module(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(OVERFLOW)
    code, report = _run(["run", "-f", "json", "--", "python", "train.py"], capsys)
    assert report["values"] == {"measured": True, "note": "measured"}
    dd301 = [f for f in report["findings"] if f["code"] == "DD301"]
    assert dd301 and dd301[0]["module"] == "0" and dd301[0]["module_type"] == "Linear" and code == 1
    # The oracle: the same fp16 forward really overflows.
    import torch

    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not torch.isfinite(linear(torch.randn(4, 8) * 1e5)).all()


UNDERFLOW = """\
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", enabled="--scaler" in sys.argv)
x, y = torch.randn(8, 32), torch.randint(0, 2, (8,))
for step in range(2):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y) * 1e-4  # a loss weight that makes every gradient tiny
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""


def test_gradients_are_measured_at_backward_with_the_users_grad_scaler_known(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(UNDERFLOW)
    code, report = _run(["run", "-f", "json", "--", "python", "train.py"], capsys)
    (dd302,) = [f for f in report["findings"] if f["code"] == "DD302"]
    assert "without loss scaling" in dd302["message"]
    # fp16 autocast training with the scaler disabled is itself an error (issue 38): DD403, exit 1.
    assert code == 1 and [f["severity"] for f in report["findings"] if f["code"] == "DD403"] == ["error"]
    # With the user's GradScaler, the gradients measured at backward are scaled: representable, no finding.
    code, report = _run(["run", "-f", "json", "--", "python", "train.py", "--scaler"], capsys)
    assert [f["code"] for f in report["findings"]] == [] and report["coverage"]["phases"]["scaler"] is True
