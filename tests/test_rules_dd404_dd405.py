"""Resuming from a checkpoint, the step after load_state_dict (run/resume.py).

DD404: Adam's float32 moments beside a model converted to bfloat16 after the optimizer's state was
loaded: the plain script raises in `exp_avg.lerp_(grad)` (on this CPU too), `run` names the state,
the parameter and the load's line before the crash. DD405: the same state loaded into a model
already bfloat16: torch's Optimizer.load_state_dict casts the moments to bfloat16, silently (shown
on the plain optimizer first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dtype_doctor.run.runner import run_script

SCRIPT = """\
import sys

import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
{early}optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ckpt = torch.load("ckpt.pt", weights_only=True)
model.load_state_dict(ckpt["model"])
optimizer.load_state_dict(ckpt["optimizer"])
{late}for step in range(3):
    loss = model(torch.randn(4, 8, dtype=torch.bfloat16)).float().pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
CONVERT = "model.to(torch.bfloat16)\n"


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _checkpoint(folder: Path) -> dict:
    """A float32 run's checkpoint: its model and its AdamW after one step (float32 moments)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    torch.save(ckpt, folder / "ckpt.pt")
    return ckpt


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    _checkpoint(tmp_path)
    return tmp_path


def test_state_loaded_before_the_conversion_raises_in_adams_update_and_run_names_it(workdir: Path) -> None:
    (workdir / "train.py").write_text(SCRIPT.format(early="", late=CONVERT))
    plain = subprocess.run([sys.executable, "train.py"], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and "RuntimeError" in plain.stderr

    result = run_script(["python", "train.py"])
    (f,) = [f for f in result.report.findings if f.severity == "error"]  # DD404 alone: not also DD100 for the lerp_
    assert f.code == "DD404" and f.stage == "optimizer" and f.pytorch_error.startswith("RuntimeError")
    script = workdir / "train.py"
    assert (f.source.file, f.source.line) == ("train.py", _line(script, "optimizer.step()"))
    assert "exp_avg" in f.message and "float32" in f.message and "bfloat16" in f.message
    assert f"train.py:{_line(script, 'optimizer.load_state_dict')}" in f.message
    resume = result.report.to_dict()["resume"]
    assert [r["kind"] for r in resume["restored"]] == ["model", "optimizer"]
    assert {m["param"] for m in resume["mismatches"]} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(not m["stepped"] for m in resume["mismatches"])


def test_the_load_casts_the_saved_moments_to_the_parameters_dtype(workdir: Path) -> None:
    ckpt = torch.load(workdir / "ckpt.pt", weights_only=True)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.load_state_dict(ckpt["optimizer"])
    assert ckpt["optimizer"]["state"][0]["exp_avg"].dtype == torch.float32
    assert opt.state[model[0].weight]["exp_avg"].dtype == torch.bfloat16  # silently, by torch's own load

    (workdir / "train.py").write_text(SCRIPT.format(early=CONVERT, late=""))
    assert subprocess.run([sys.executable, "train.py"], cwd=workdir, capture_output=True, timeout=120).returncode == 0
    result = run_script(["python", "train.py"])
    (f,) = [f for f in result.report.findings if f.code == "DD405"]
    assert f.severity == "warning" and (f.source.file, f.source.line) == ("train.py", _line(workdir / "train.py", "optimizer.load_state_dict"))
    assert "8 saved state tensor(s) (exp_avg, exp_avg_sq) from float32 to bfloat16" in f.message
    assert not [x for x in result.report.findings if x.code == "DD404"]  # the load left state and parameters alike


def test_a_float32_resume_is_clean(workdir: Path) -> None:
    (workdir / "train.py").write_text(SCRIPT.format(early="", late="").replace(", dtype=torch.bfloat16", ""))
    result = run_script(["python", "train.py"])
    assert [f.code for f in result.report.findings if f.code in ("DD404", "DD405")] == []
    assert [r.kind for r in result.report.trace.resume.restored] == ["model", "optimizer"]


def test_a_grad_scalers_restore_is_seen_with_the_models_and_the_optimizers(workdir: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ckpt = torch.load(workdir / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "scaler": scaler.state_dict()}, workdir / "ckpt.pt")
    script = SCRIPT.format(early="", late="").replace(", dtype=torch.bfloat16", "").replace(
        'optimizer.load_state_dict(ckpt["optimizer"])\n',
        'optimizer.load_state_dict(ckpt["optimizer"])\nscaler = torch.amp.GradScaler("cpu")\nscaler.load_state_dict(ckpt["scaler"])\n')
    (workdir / "train.py").write_text(script)
    result = run_script(["python", "train.py"])
    restored = result.report.trace.resume.restored
    assert [(r.kind, r.class_name) for r in restored] == [("model", "Sequential"), ("optimizer", "AdamW"), ("scaler", "GradScaler")]
    assert restored[2].source.line == _line(workdir / "train.py", "scaler.load_state_dict")


def test_simulated_cuda_names_the_same_mismatch_on_cuda(workdir: Path) -> None:
    from dtype_doctor.run.runner import RunOptions

    script = SCRIPT.format(early="", late=CONVERT).replace("nn.Linear(8, 2))\n", "nn.Linear(8, 2)).cuda()\n", 1)
    script = script.replace('weights_only=True)', 'weights_only=True, map_location="cuda")')
    (workdir / "train.py").write_text(script.replace("dtype=torch.bfloat16)", 'dtype=torch.bfloat16, device="cuda")'))
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, gpu="a100", device="cuda"))
    (f,) = [f for f in result.report.findings if f.code == "DD404"]
    assert f.severity == "error" and "float32 cuda:0" in f.message and "bfloat16 cuda:0" in f.message
