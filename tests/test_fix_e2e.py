"""End to end on real user code: the script fails with a real PyTorch error, `dtype-doctor fix
--write-patch` writes a patch, `git apply` applies it, and the script then runs for real.

Scripts live in tests/pipelines/. After the patch every scenario is scanned again and must be
clean: with `scan` where the patched pipeline is expressed with scan's options (--preprocess,
--autocast, --train), else with `dtype-doctor run` on the patched script itself (which must
have seen the unpatched script's error, or its clean verdict would mean nothing).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from helpers_errors import last_error, names_dtypes

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = Path(__file__).resolve().parent / "pipelines"
FIX = ROOT / "fixtures"


@dataclass(frozen=True)
class Scenario:
    script: str
    model: str
    data: str
    error: tuple[str, tuple[str, ...]]  # what the unpatched script dies of: the class and the dtypes it names
    fix_args: tuple[str, ...]
    strategy: str  # the strategy auto must pick
    patched: str  # the file the patch changes
    scan_after: tuple[str, ...] | None  # scan options equivalent to the patched pipeline


SCENARIOS = [
    Scenario(
        "classify_images.py", "models/resnet-tiny", "demo/data",
        ("RuntimeError", ("float16", "float32")),
        ("--preprocess", "prep_half.py:preprocess", "--preprocess-mode", "transform"),
        "cast-inputs", "prep_half.py",
        ("--preprocess", "prep_half.py:preprocess", "--preprocess-mode", "transform"),
    ),
    Scenario(
        "classify_text.py", "models/bert-tiny", "data/text-cls",
        ("RuntimeError", ("int32",)),
        ("--preprocess", "prep_labels.py:preprocess", "--preprocess-mode", "transform", "--collator", "none"),
        "cast-inputs", "prep_labels.py",
        ("--preprocess", "prep_labels.py:preprocess", "--preprocess-mode", "transform", "--collator", "none"),
    ),
    Scenario(
        "audio_half.py", "models/wav2vec2-tiny", "data/audio",
        ("RuntimeError", ("float32", "float16")),
        ("--dtype", "float16", "--script", "audio_half.py"),
        "cast-inputs", "audio_half.py", None,
    ),
    Scenario(
        "train_amp.py", "models/bert-tiny", "data/text-cls",
        ("ValueError", ("float16",)),
        ("--dtype", "float16", "--train", "--autocast", "float16", "--script", "train_amp.py"),
        "fp32-trainable", "train_amp.py",
        ("--train", "--autocast", "float16"),
    ),
    Scenario(
        "map_half.py", "models/resnet-tiny", "demo/data",
        ("RuntimeError", ("float32", "float16")),
        ("--dtype", "float16", "--script", "map_half.py"),
        "cast-inputs", "map_half.py", None,
    ),
]


def _env(model: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "MODEL_DIR": str(model), "PYTHONDONTWRITEBYTECODE": "1"}


def _script(repo: Path, s: Scenario) -> subprocess.CompletedProcess:
    # A copy of the data: user scripts call .map(), which writes cache files beside it.
    data = repo / "data-copy"
    if not data.exists():
        shutil.copytree(FIX / s.data, data)
    return subprocess.run(
        [sys.executable, s.script, str(FIX / s.model), str(data)],
        cwd=repo, env=_env(FIX / s.model), capture_output=True, text=True, timeout=300,
    )


def _run(repo: Path, s: Scenario) -> dict:
    """`dtype-doctor run` on the scenario's script, as the user runs it: the JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "run", "--format", "json", "--", sys.executable, s.script,
         str(FIX / s.model), str(repo / "data-copy")],
        cwd=repo, env=_env(FIX / s.model), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return json.loads(done.stdout)


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    return exit_info.value.code, capsys.readouterr().out


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for f in PIPELINES.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "user code"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("s", SCENARIOS, ids=[s.script for s in SCENARIOS])
def test_fix_patch_apply_run(s: Scenario, repo: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_DIR", str(FIX / s.model))
    before = _script(repo, s)
    error, dtypes = last_error(before.stderr)
    assert before.returncode != 0 and error == s.error[0], before.stderr[-2000:]
    assert names_dtypes(before.stderr.strip().splitlines()[-1], *s.error[1]), before.stderr[-2000:]
    run_before = _run(repo, s) if s.scan_after is None else None
    assert run_before is None or run_before["summary"]["error"] >= 1, "run sees the unpatched script's error"

    code, out = _cli(["fix", str(FIX / s.model), str(FIX / s.data), *s.fix_args, "--write-patch", "fix.patch", "--format", "json"], capsys)
    report = json.loads(out)
    fix = report["fix"]
    assert code == 0 and fix["verified"] is True, fix
    assert report["findings"], "the broken pipeline has findings"
    assert [a["strategy"] for a in fix["applied"] if a["status"] == "applied"] == [s.strategy]
    assert fix["after"]["summary"]["error"] == 0
    assert fix["parity"]["cosine"] > 0.99 and fix["parity"]["reference"] == "float32"
    assert fix["patch"]["files"] == [s.patched]
    # The fix touched nothing but the patch file.
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert sorted(status.split()) == sorted(["??", "fix.patch", "??", "data-copy/"])

    subprocess.run(["git", "apply", "--check", "fix.patch"], cwd=repo, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    after = _script(repo, s)
    assert after.returncode == 0, after.stderr[-2000:]

    if s.scan_after is not None:
        code, out = _cli(["scan", str(FIX / s.model), str(FIX / s.data), *s.scan_after, "--format", "json"], capsys)
        assert code == 0, out
        assert json.loads(out)["summary"]["error"] == 0
        return
    run_after = _run(repo, s)
    assert run_after["summary"]["error"] == 0, run_after["findings"]


def test_patch_never_overwrites_without_force(repo: Path, capsys: pytest.CaptureFixture) -> None:
    (repo / "fix.patch").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        run(["fix", str(FIX / "demo/model"), str(FIX / "demo/data"), "--write-patch", "fix.patch"])
    assert exit_info.value.code == 2
    assert "already exists" in capsys.readouterr().err
    assert (repo / "fix.patch").read_text() == "mine\n"


def test_without_user_code_the_patch_adds_a_fix_module(repo: Path, capsys: pytest.CaptureFixture) -> None:
    code, out = _cli(["fix", str(FIX / "demo/model"), str(FIX / "demo/data"), "--write-patch", "fix.patch", "--format", "json"], capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["patch"]["files"] == ["dtype_doctor_fix.py"]
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    module = (repo / "dtype_doctor_fix.py").read_text()
    assert "def apply_fix(model, batch)" in module and "DD101" in module
    # scan is clean on the pipeline with the module in it, checked as the fix said to.
    code, out = _cli(shlex.split(fix["patch"]["check"])[1:] + ["--format", "json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["error"] == 0, out
    # The module does what the fix did: the demo's fp16 model runs on the fixed batch.
    check = (
        "import torch, dtype_doctor_fix\n"
        "from transformers import AutoModelForImageClassification\n"
        f"m = AutoModelForImageClassification.from_pretrained({str(FIX / 'demo/model')!r})\n"
        "batch = {'pixel_values': torch.randn(2, 3, 32, 32)}\n"
        "m(**dtype_doctor_fix.apply_fix(m, batch))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=repo, env=_env(FIX / "demo/model"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_script_the_codemods_cannot_edit_falls_back_to_the_fix_module(repo: Path, capsys: pytest.CaptureFixture) -> None:
    (repo / "noforward.py").write_text("print('this script never calls the model')\n")
    with pytest.raises(SystemExit) as exit_info:
        run(["fix", str(FIX / "demo/model"), str(FIX / "demo/data"), "--script", "noforward.py",
             "--write-patch", "fix.patch", "--format", "json", "--fail-on", "never"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0
    fix = json.loads(captured.out)["fix"]
    assert fix["verified"] is True and fix["patch"]["files"] == ["dtype_doctor_fix.py"]
    tried = [(e["codemod"], e["status"]) for e in fix["patch"]["edits"]]
    assert tried == [("CastBatch", "skipped"), ("NewFixModule", "applied")]
    subprocess.run(["git", "apply", "--check", "fix.patch"], cwd=repo, check=True)
