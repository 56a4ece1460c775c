"""`fix --write-patch` always lands: for preprocess functions that build float input_ids with
numpy, with .astype, with torch.tensor(dtype=) and with no cast at all, the patch applies with
`git apply` and `scan` of the patched pipeline is clean. A patch that cannot be written exits 1."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

FIX = Path(__file__).resolve().parent.parent / "fixtures"
MODEL, DATA = str(FIX / "models/bert-tiny"), str(FIX / "data/text-cls")

PREPROCESS = {
    # The case: numpy makes float64 ids, the formatter narrows them to float32.
    "numpy-nan": ("CastReturnedValue", """
        import numpy as np


        def preprocess(example):
            ids = np.full(8, np.nan)
            ids[: len(example["text"]) % 8 + 1] = 5
            ids = np.nan_to_num(ids)
            return {"input_ids": ids, "attention_mask": np.ones(8, dtype=np.int64)}
    """),
    "astype": ("RetargetCast", """
        import numpy as np


        def preprocess(example):
            ids = (np.arange(8) + len(example["text"]) % 5).astype(np.float32)
            return {"input_ids": ids, "attention_mask": np.ones(8, dtype=np.int64)}
    """),
    "torch-tensor-dtype": ("RetargetCast", """
        import torch


        def preprocess(example):
            out = {"attention_mask": torch.ones(8, dtype=torch.long)}
            out["input_ids"] = torch.tensor([3, 4, 5, 6, 7, 8, 9, 10], dtype=torch.float32)
            return out
    """),
    "no-cast": ("CastReturnedValue", """
        def preprocess(example):
            ids = [float(2 + i) for i in range(8)]
            return dict(input_ids=ids, attention_mask=[1] * 8)
    """),
}


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _git(tmp_path, "init", "-q")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.parametrize("case", sorted(PREPROCESS))
def test_float_ids_from_preprocess_get_a_patch_that_applies_and_scans_clean(case: str, repo: Path, capsys) -> None:
    codemod, text = PREPROCESS[case]
    (repo / "prep.py").write_text(textwrap.dedent(text).lstrip())
    _git(repo, "add", "prep.py")
    _git(repo, "commit", "-qm", "user code")
    pre = ["--preprocess", "prep.py:preprocess"]

    code, out, _ = _cli(["scan", MODEL, DATA, *pre, "--format", "json"], capsys)
    report = json.loads(out)
    dd103 = [f for f in report["findings"] if f["code"] == "DD103"]
    assert code == 1 and dd103 and {f["stage"] for f in dd103} == {"preprocess"}

    code, out, err = _cli(["fix", MODEL, DATA, *pre, "--write-patch", "fix.patch", "--format", "json"], capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["verified"], err
    assert fix["patch"]["files"] == ["prep.py"]
    assert codemod in {e["codemod"] for e in fix["patch"]["edits"] if e["status"] == "applied"}
    _git(repo, "apply", "--check", "fix.patch")
    _git(repo, "apply", "fix.patch")

    code, out, _ = _cli(["scan", MODEL, DATA, *pre, "--format", "json"], capsys)
    after = json.loads(out)
    assert code == 0 and after["summary"]["error"] == 0, after["findings"]


def test_a_patch_that_cannot_be_written_exits_1_with_one_line(repo: Path, capsys) -> None:
    """No user code takes the cast and the fix module's file is taken: no patch, exit 1."""
    (repo / "dtype_doctor_fix.py").write_text("# the user's own file\n")
    code, out, err = _cli(["fix", str(FIX / "demo/model"), str(FIX / "demo/data"), "--write-patch", "fix.patch"], capsys)
    assert code == 1 and not (repo / "fix.patch").exists()
    [line] = err.strip().splitlines()[-1:]
    assert line.startswith("dtype-doctor: no patch written:") and "dtype_doctor_fix.py already exists" in line
