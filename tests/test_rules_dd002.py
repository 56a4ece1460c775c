"""DD002 simulated-gpu-unused: a script left on the CPU under --simulate is not a clean bill for the GPU.

The shape is pytorch/examples' and many training scripts': the device comes from the script's own
argument (`--device`, default cpu), so under `run --simulate --gpu t4` the script still trains on
the CPU unless it is told otherwise. The plain run shows where the script's model lives first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

SCRIPT = """
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(args.device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 8, device=args.device)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print("step", step, "on", next(model.parameters()).device)
"""


@pytest.fixture()
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    return "train.py"


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as done:
        run(["run", "-f", "json", *argv])
    return done.value.code, json.loads(capsys.readouterr().out)


def test_the_plain_script_trains_on_the_cpu_unless_told(script: str) -> None:
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
    assert "step 1 on cpu" in done.stdout


def test_a_simulated_run_left_on_the_cpu_is_an_error(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _report(capsys, "--simulate", "--gpu", "t4", "--", "python", script)
    found = [f for f in report["findings"] if f["code"] == "DD002"]
    assert code == 1 and len(found) == 1 and found[0]["severity"] == "error"
    assert found[0]["message"].startswith("--simulate gave the script a t4") and report["target"]["device"] == "cpu"


def test_the_same_script_told_to_use_the_gpu_is_clean(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _report(capsys, "--simulate", "--gpu", "t4", "--", "python", script, "--device", "cuda")
    assert code == 0 and report["findings"] == [] and report["target"]["device"] == "cuda:0"


def test_a_real_run_on_the_cpu_is_not_judged(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _report(capsys, "--", "python", script)
    assert code == 0 and not [f for f in report["findings"] if f["code"] == "DD002"]
