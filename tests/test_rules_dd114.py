"""DD114 mixed-tf32-apis: a TF32 switch set through one API (fp32_precision / allow_tf32) and read
through the other. PyTorch raises RuntimeError on the read, on this CPU build too (the check is on
the flags, aten/src/ATen/Context.cpp); each test shows the plain script failing first, then `run`
naming both lines before the crash, and `fix --run` moving the script to the new API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtype_doctor.cli.main import run as cli
from dtype_doctor.fix.codemods import Tf32ToNewApi
from dtype_doctor.run.runner import run_script

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}

SCRIPT_MIX = """\
import torch

torch.backends.cuda.matmul.fp32_precision = "tf32"
model = torch.nn.Linear(4, 2)
if torch.backends.cuda.matmul.allow_tf32:
    print("tf32 on")
loss = model(torch.randn(3, 4)).sum()
loss.backward()
"""

# A library that reads the legacy switch (as Lightning's and inductor's checks did), called in the step.
LIBRARY = """\
import torch


def check_tf32():
    return torch.backends.cuda.matmul.allow_tf32
"""

SCRIPT_LIBRARY_READS = """\
import torch
import tf32lib

torch.backends.cuda.matmul.fp32_precision = "tf32"
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.randn(3, 4)).sum()
    tf32lib.check_tf32()
    loss.backward()
    opt.step()
"""


def _plain(path: Path, cwd: Path, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {**ENV, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, ENV.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tf32lib installed as a library is: under a site-packages folder, importable."""
    site = tmp_path / "site-packages"
    (site / "tf32lib").mkdir(parents=True)
    (site / "tf32lib" / "__init__.py").write_text(LIBRARY)
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("tf32lib", None)


def _clean_process() -> None:
    """What the run leaves behind: the switches as torch starts (every read answers)."""
    assert torch.get_default_dtype() == torch.float32
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.fp32_precision == "none"


def test_the_plain_script_raises_and_run_names_the_setter_and_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_MIX)
    plain = _plain(script, tmp_path)
    assert plain.returncode == 1 and "RuntimeError" in plain.stderr  # PyTorch refuses the read, on this CPU too

    monkeypatch.chdir(tmp_path)
    result = run_script(["python", "train.py"])  # today: "raised RuntimeError before calling a model"
    (f,) = result.report.findings
    assert f.code == "DD114" and f.severity == "error" and f.pytorch_error.startswith("RuntimeError")
    assert "train.py:3" in f.message and "train.py:5" in f.message
    assert (f.source.file, f.source.line) == ("train.py", 5)  # the legacy read is the line to change
    assert [(r.strategy, r.target) for r in f.remedies] == [("tf32-new-api", "torch.backends.cuda.matmul.allow_tf32")]
    (mix,) = result.report.trace.precision.mixes
    assert (mix.setter.by, mix.setter.source.line, mix.reader.by, mix.reader.source.line) == ("script", 3, "script", 5)
    report = result.report.to_dict()
    switches = {s["name"]: s for s in report["precision"]["switches"]}
    assert switches["torch.backends.cuda.matmul.fp32_precision"]["value"] == "tf32"
    assert switches["torch.backends.cuda.matmul.fp32_precision"]["set_by"]["source"] == {"file": "train.py", "line": 3}
    assert switches["torch.backends.cuda.matmul.allow_tf32"]["value"] == "unreadable"
    _clean_process()


def test_a_library_reading_the_legacy_switch_in_the_step_is_named_with_the_scripts_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_LIBRARY_READS)
    plain = _plain(script, tmp_path, str(library))
    assert plain.returncode == 1 and "RuntimeError" in plain.stderr

    monkeypatch.chdir(tmp_path)
    result = run_script(["python", "train.py"])
    assert result.report.trace.modules  # the step ran up to the library's read
    (f,) = [f for f in result.report.findings if f.code == "DD114"]
    assert [x.code for x in result.report.findings if x.severity == "error"] == ["DD114"]  # not also DD001
    (mix,) = result.report.trace.precision.mixes
    assert mix.reader.by == "library" and mix.reader.library == "tf32lib" and mix.reader.via.line == 9
    assert "tf32lib" in f.message and "train.py:9" in f.message and "train.py:4" in f.message
    assert f.remedies == () and any("tf32lib" in h for h in f.hints)  # a library's read: display-only
    _clean_process()


def test_fix_run_moves_the_script_to_the_new_api_and_the_patched_script_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                               capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_MIX)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        cli(["fix", "--run", "--write-patch", "fix.patch", "-f", "json", "--", "python", "train.py"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    fix = json.loads(out)["fix"]
    assert fix["verified"] is True and script.read_text() == SCRIPT_MIX  # the patch, not the file
    patch = (tmp_path / "fix.patch").read_text()
    assert '+if (torch.backends.cuda.matmul.fp32_precision == "tf32"):' in patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    assert _plain(script, tmp_path).returncode == 0  # PyTorch reads it now


def test_the_codemod_rewrites_legacy_setters_and_reads_and_leaves_what_it_cannot_say() -> None:
    before = (
        "import torch\n"
        "torch.backends.cuda.matmul.allow_tf32 = True  # faster\n"
        "torch.backends.cudnn.allow_tf32 = use_tf32\n"
        "torch.set_float32_matmul_precision('high')\n"
        "torch.set_float32_matmul_precision('medium')\n"
        "print(torch.backends.cudnn.allow_tf32)\n"
    )
    result = Tf32ToNewApi().apply(before, "train.py")
    assert result.applied
    assert result.new_source == (
        "import torch\n"
        "torch.backends.cuda.matmul.fp32_precision = \"tf32\"  # faster\n"
        "torch.backends.cudnn.conv.fp32_precision = \"tf32\" if (use_tf32) else \"ieee\"\n"
        "torch.backends.cudnn.rnn.fp32_precision = \"tf32\" if (use_tf32) else \"ieee\"\n"
        "torch.backends.cuda.matmul.fp32_precision = \"tf32\"\n"
        "torch.set_float32_matmul_precision('medium')\n"
        "print((torch.backends.cudnn.conv.fp32_precision == \"tf32\"))\n"
    )
    assert any("medium" in w for w in result.warnings)
    assert Tf32ToNewApi().apply("import torch\nx = 1\n", "a.py").status == "skipped"


def test_the_new_lines_set_what_the_legacy_ones_set() -> None:
    """Each rewritten setter, run, reads back through its own API as the legacy one read back: True as "tf32",
    False as "ieee", cuDNN's one legacy switch as conv's and rnn's."""
    code = "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = False\n"
    legacy = "\nprint(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)"
    read = ("\nprint(torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision, "
            "torch.backends.cudnn.rnn.fp32_precision)")
    new = Tf32ToNewApi().apply(code, "a.py").new_source
    legacy_after = subprocess.run([sys.executable, "-c", code + legacy], capture_output=True, text=True, timeout=60)
    new_after = subprocess.run([sys.executable, "-c", new + read], capture_output=True, text=True, timeout=60)
    assert legacy_after.stdout.split() == ["True", "False"], legacy_after.stderr
    assert new_after.stdout.split() == ["tf32", "ieee", "ieee"], new_after.stderr


def test_a_scan_reports_the_switches_unwatched() -> None:
    import dtype_doctor

    report = dtype_doctor.diagnose(torch.nn.Linear(4, 2), {"input": torch.randn(2, 4)}).to_dict()
    assert report["precision"]["watched"] is False
    assert {s["name"] for s in report["precision"]["switches"]} >= {
        "torch.get_default_dtype()", "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cuda.matmul.fp32_precision",
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", "torch.use_deterministic_algorithms",
        "torch.set_float32_matmul_precision"}
