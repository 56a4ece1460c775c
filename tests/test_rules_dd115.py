"""DD115 default-dtype-left-changed: a library's torch.set_default_dtype left in force. The plain
script shows the silent change first (its own tensors and model come out bfloat16, no error); `run`
names the library's line and the script's call into it. A library that restores the default (as
transformers' from_pretrained does) is not reported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtype_doctor.run.runner import run_script

LIBRARY = """\
import torch


def build_engine():
    torch.set_default_dtype(torch.bfloat16)  # for its own weights; never set back


def build_and_restore():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_dtype(before)
"""

SCRIPT = """\
import torch
import enginelib

enginelib.{call}()
model = torch.nn.Linear(4, 2)
x = torch.randn(3, 4)
print(model.weight.dtype, x.dtype)
loss = model(x).float().sum()
loss.backward()
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site-packages"
    (folder / "enginelib").mkdir(parents=True)
    (folder / "enginelib" / "__init__.py").write_text(LIBRARY)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    yield folder
    sys.modules.pop("enginelib", None)


def _plain(tmp_path: Path, site: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(site), os.environ.get("PYTHONPATH", "")))}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_library_left_the_default_bfloat16_and_run_names_it(tmp_path: Path, site: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.format(call="build_engine"))
    assert _plain(tmp_path, site) == "torch.bfloat16 torch.bfloat16"  # silently: the script's own model and input
    result = run_script(["python", "train.py"])
    (f,) = [f for f in result.report.findings if f.code == "DD115"]
    assert f.severity == "warning" and "enginelib" in f.message and "bfloat16" in f.message
    assert (f.source.file, f.source.line) == ("train.py", 4)  # the script's call into the library
    assert "2 of 2" in f.message  # the model built after it is bfloat16
    (change,) = result.report.trace.precision.default_dtype
    assert (change.dtype, change.before, change.setter.library) == ("bfloat16", "float32", "enginelib")
    assert change.setter.source.file.endswith("enginelib/__init__.py") and change.setter.source.line == 5
    assert torch.get_default_dtype() == torch.float32  # the doctor's process is put back


def test_a_library_that_restores_the_default_is_not_reported(tmp_path: Path, site: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.format(call="build_and_restore"))
    assert _plain(tmp_path, site) == "torch.float32 torch.float32"
    result = run_script(["python", "train.py"])
    assert not [f for f in result.report.findings if f.code == "DD115"]
    assert [c.dtype for c in result.report.trace.precision.default_dtype] == ["bfloat16", "float32"]  # both seen


def test_the_script_setting_its_own_default_is_its_choice(tmp_path: Path, site: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.format(call="build_and_restore").replace(
        "enginelib.build_and_restore()", "torch.set_default_dtype(torch.float64)"))
    result = run_script(["python", "train.py"])
    assert not [f for f in result.report.findings if f.code == "DD115"]
    switch = result.report.trace.precision.switch("torch.get_default_dtype()")
    assert switch.value == "float64" and switch.setter.by == "script" and switch.setter.source.line == 4
