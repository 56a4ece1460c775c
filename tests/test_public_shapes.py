"""The script sweep's injections (benchmarks/script_sweep.py, issue 38) on team-written scripts in the shapes of
public ones (tests/scripts_public_shapes/): each script runs plainly as written; one bug is injected as a text
edit, the way the sweep mutates its fetched copies; then `run` must find it at the user's line, and `fix --run`
must write a patch after which the script runs.

Where the bug is one this CPU really has, PyTorch is the oracle: plain `python` dies of it first. A GPU-only bug
is checked under `--simulate` (a tensor left on the CPU meets a CUDA weight: CUDA's
`Expected all tensors to be on the same device` check in TensorIterator / the LSTM's own `_check_input_device`).

The xfail marks name defects the sweep found that are still open (benchmarks/SCRIPT_SWEEP.md's classes); each
is strict, so it turns into a failure the day the fix lands and the mark is removed (S1, S3, S5, S6 and S9 were, on
2026-11-28).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

SHAPES = Path(__file__).resolve().parent / "scripts_public_shapes"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
T4 = ["--simulate", "--gpu", "t4"]


def _workspace(tmp_path: Path, script: str, old: str = "", new: str = "") -> Path:
    """The script copied into a git repository (the user's project), then the bug injected, uncommitted."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(SHAPES / script, root / script)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "user code"], cwd=root, check=True)
    if old:
        text = (root / script).read_text()
        assert text.count(old) == 1, old
        (root / script).write_text(text.replace(old, new))
    return root


def _line_of(root: Path, script: str, text: str) -> int:
    return next(i for i, line in enumerate((root / script).read_text().splitlines(), 1) if text in line)


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict | None, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    try:
        report = json.loads(captured.out)
    except json.JSONDecodeError:
        report = None
    return exit_info.value.code, report, captured.err


def _python(root: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script], cwd=root, env=ENV, capture_output=True, text=True, timeout=120)


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def _named_at(finding: dict, script: str, line: int) -> bool:
    source = finding.get("source") or {}
    return Path(str(source.get("file"))).name == script and source.get("line") == line


@pytest.mark.parametrize("script", ["accel_loop.py", "lstm_lm.py", "rope_lm.py", "list_batch.py", "gan_loop.py", "poly_fit.py"])
def test_each_shape_runs_plainly_and_clean_under_run(script: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = _workspace(tmp_path, script)
    assert _python(root, script).returncode == 0
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and report is not None and _errors(report) == [], err[-2000:]


def test_int32_targets_made_in_getitem_are_found_there_and_fixed_there(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # minGPT's adder shape: the dataset's __getitem__ makes the targets (int32 here); cross_entropy refuses them.
    made = "        return x, ((x + 1) % 10).int()"
    root = _workspace(tmp_path, "list_batch.py", "        return x, (x + 1) % 10", made)
    assert _python(root, "list_batch.py").returncode != 0  # the bug is real on this CPU
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", "-f", "json", "--", "python", "list_batch.py"], capsys)
    line = _line_of(root, "list_batch.py", made.strip())
    assert code == 1 and any(_named_at(f, "list_batch.py", line) for f in _errors(report)), report["findings"]
    code, report, err = _cli(["fix", "--run", "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "list_batch.py"], capsys)
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    assert _python(root, "list_batch.py").returncode == 0  # the whole script, to its end


def test_a_script_that_picks_its_device_with_torch_accelerator_is_traced_on_the_simulated_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _workspace(tmp_path, "accel_loop.py")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "accel_loop.py"], capsys)
    assert report is not None, err[-2000:]
    assert report["target"]["device"].startswith("cuda") and report["target"]["simulated"] is True, report["target"]


def test_an_lstm_hidden_state_made_on_the_cpu_is_named_at_init_hidden(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    old = ("        return (weight.new_zeros(self.nlayers, bsz, self.nhid),\n"
           "                weight.new_zeros(self.nlayers, bsz, self.nhid))")
    new = ("        return (torch.zeros(self.nlayers, bsz, self.nhid),\n"
           "                torch.zeros(self.nlayers, bsz, self.nhid))")
    root = _workspace(tmp_path, "lstm_lm.py", old, new)
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "lstm_lm.py"], capsys)
    first = _line_of(root, "lstm_lm.py", "return (torch.zeros(")
    assert code == 1 and any(_named_at(f, "lstm_lm.py", n) for f in _errors(report) for n in (first, first + 1)), \
        report["findings"]


def test_rope_tables_kept_as_plain_attributes_are_named_where_they_are_made(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    old = '        self.register_buffer("freqs_cos", freqs_cos, persistent=False)'
    root = _workspace(tmp_path, "rope_lm.py", old, "        self.freqs_cos = freqs_cos")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "rope_lm.py"], capsys)
    line = _line_of(root, "rope_lm.py", "self.freqs_cos = freqs_cos")
    assert code == 1 and any(_named_at(f, "rope_lm.py", line) for f in _errors(report)), report["findings"]


def test_a_list_batch_left_on_the_cpu_is_moved_where_the_script_moves_it(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    moved = "            batch = [t.to(self.device) for t in batch]"
    root = _workspace(tmp_path, "list_batch.py", moved, "            batch = [t for t in batch]")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "list_batch.py"], capsys)
    # The model takes `x` from `x, y = batch`; the move was dropped where `batch` was made, one line up.
    line = _line_of(root, "list_batch.py", "batch = [t for t in batch]")
    assert code == 1 and any(_named_at(f, "list_batch.py", line) for f in _errors(report)), report["findings"]
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "list_batch.py"], capsys)
    assert code == 0 and report is not None and report["fix"]["verified"] is True, err[-2000:]
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "list_batch.py"], capsys)
    assert code == 0 and _errors(report) == []
    assert _python(root, "list_batch.py").returncode == 0


@pytest.mark.slow
def test_a_dataloader_with_a_worker_runs_under_simulate(tmp_path: Path) -> None:
    root = _workspace(tmp_path, "worker_loader.py")
    assert _python(root, "worker_loader.py").returncode == 0
    cli = [sys.executable, "-m", "dtype_doctor.cli.main"]
    proc = subprocess.run([*cli, "run", *T4, "--timeout", "30", "-f", "json", "--", "python", "worker_loader.py"],
                          cwd=root, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["target"]["device"].startswith("cuda")
