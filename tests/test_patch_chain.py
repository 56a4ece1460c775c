"""`fix --write-patch` always lands: for preprocess functions that build float input_ids with
numpy, with .astype, with torch.tensor(dtype=), with no cast at all and with early returns, the
patch applies with `git apply` and `scan` of the patched pipeline is clean; so it is for every
fixture scenario whose fix lands in the fix module, checked with the command the fix prints.
A patch that cannot be written, or leaves a verified change out, exits 1; nothing to fix
writes nothing and exits 0."""

from __future__ import annotations

import json
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from dtype_doctor.fix.outcome import Change

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
    # The values are made float by Python's float(): that call is where the dtype was decided, and
    # fix --run's origin rule (issue 38) rewrites it there, float(...) -> int(...).
    "no-cast": ("RetargetCast", """
        def preprocess(example):
            ids = [float(2 + i) for i in range(8)]
            return dict(input_ids=ids, attention_mask=[1] * 8)
    """),
    "inline-return": ("CastReturnedValue", """
        import numpy as np


        def preprocess(example):
            out = {"label": example["label"], "attention_mask": np.ones(8, dtype=np.int64)}
            out["input_ids"] = np.nan_to_num(np.full(8, np.nan)) + 3
            if example["label"] == 0: return out
            return out
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


def _check(fix: dict, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """Run the command the fix printed to check the patched pipeline."""
    words = shlex.split(fix["patch"]["check"])
    assert words[:2] == ["dtype-doctor", "scan"]
    code, out, _ = _cli([*words[1:], "--format", "json"], capsys)
    return code, out


FIXTURE_SCENARIOS = {
    # No user code: the fix module's transform calls the model's processor, then casts.
    "image-processor": ("demo/model", "demo/data", ()),
    "audio-fp16": ("models/wav2vec2-tiny", "data/audio", ("--dtype", "float16")),
    "regression-labels": ("models/bert-tiny-regression", "data/text-regression-int", ("--fail-on", "warning")),
    # Map mode: the formatter undoes a float16 cast, so the transform wraps the user's function.
    "map-formatter": ("demo/model", "demo/data", ("--preprocess", "prep.py:preprocess")),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FIXTURE_SCENARIOS))
def test_a_fix_module_patch_ends_in_a_clean_scan_with_the_command_fix_prints(case: str, repo: Path, capsys) -> None:
    model, data, options = FIXTURE_SCENARIOS[case]
    (repo / "prep.py").write_text((FIX / "demo/prep.py").read_text())
    _git(repo, "add", "prep.py")
    _git(repo, "commit", "-qm", "user code")
    code, out, err = _cli(["fix", str(FIX / model), str(FIX / data), *options, "--write-patch", "fix.patch", "--format", "json"], capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["verified"] and fix["patch"]["files"] == ["dtype_doctor_fix.py"], err
    assert "--preprocess dtype_doctor_fix.py:preprocess --preprocess-mode transform" in fix["patch"]["check"]
    _git(repo, "apply", "fix.patch")
    code, out = _check(fix, capsys)
    assert code == 0 and json.loads(out)["summary"]["error"] == 0, out


@pytest.mark.slow
def test_a_label_the_function_never_returns_is_not_patched_into_it(repo: Path, capsys) -> None:
    """Tokenize-only preprocess: labels come from the dataset column (the collator renames
    label → labels), so `enc["labels"] = …` in the function would raise KeyError."""
    (repo / "prep.py").write_text('def preprocess(example, tokenizer):\n    enc = tokenizer(example["text"], truncation=True)\n    return enc\n')
    _git(repo, "add", "prep.py")
    _git(repo, "commit", "-qm", "user code")
    model, data = str(FIX / "models/bert-tiny-regression"), str(FIX / "data/text-regression-int")
    argv = ["fix", model, data, "--preprocess", "prep.py:preprocess", "--fail-on", "warning", "--write-patch", "fix.patch", "--format", "json"]
    code, out, err = _cli(argv, capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["patch"]["files"] == ["dtype_doctor_fix.py"], err
    assert [e["codemod"] for e in fix["patch"]["edits"]] == ["NewFixModule"]  # no attempt on prep.py
    _git(repo, "apply", "fix.patch")
    code, out = _check(fix, capsys)
    assert code == 0 and json.loads(out)["summary"]["warning"] == 0, out


def test_nothing_to_fix_writes_no_patch_and_exits_0(repo: Path, capsys) -> None:
    argv = ["fix", str(FIX / "models/bert-tiny"), str(FIX / "data/text-pretok"), "--write-patch", "fix.patch", "--format", "json"]
    code, out, err = _cli(argv, capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["verified"] and fix["detail"] == "nothing to fix" and fix["patch"] is None
    assert err.strip().splitlines()[-1] == "dtype-doctor: no patch written: nothing to fix"
    assert not (repo / "fix.patch").exists()


@pytest.mark.slow
def test_a_patch_that_leaves_a_verified_change_out_exits_1_and_names_it(repo: Path, capsys) -> None:
    """The cast lands in prep.py, the fp32-trainable fix needs the fix module, and that file is the user's."""
    codemod, text = PREPROCESS["astype"]
    (repo / "prep.py").write_text(textwrap.dedent(text).lstrip())
    (repo / "dtype_doctor_fix.py").write_text("# the user's own file\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "user code")
    argv = ["fix", MODEL, DATA, "--preprocess", "prep.py:preprocess", "--dtype", "float16", "--train", "--autocast", "float16",
            "--write-patch", "fix.patch", "--format", "json"]
    code, out, err = _cli(argv, capsys)
    patch = json.loads(out)["fix"]["patch"]
    assert code == 1 and patch["files"] == ["prep.py"]
    assert "keep the trainable parameters in float32" in patch["unwritten"][0]
    line = err.strip().splitlines()[-1]
    assert line.startswith("dtype-doctor: fix.patch leaves out: keep the trainable parameters in float32")
    assert "dtype_doctor_fix.py already exists; pass --force" in line
    # With --force the fix module is replaced, and the patch holds every change.
    (repo / "fix.patch").unlink()
    code, out, err = _cli([*argv, "--force"], capsys)
    patch = json.loads(out)["fix"]["patch"]
    assert code == 0 and patch["files"] == ["prep.py", "dtype_doctor_fix.py"] and "unwritten" not in patch, err
    _git(repo, "apply", "fix.patch")
    code, out = _check(json.loads(out)["fix"], capsys)
    assert code == 0, out


def test_an_attempt_whose_patched_pipeline_fails_gives_way_to_the_next(tmp_path: Path) -> None:
    from dtype_doctor.fix import patches
    from dtype_doctor.fix.outcome import Step

    prep = tmp_path / "prep.py"
    prep.write_text(textwrap.dedent(PREPROCESS["astype"][1]).lstrip())
    code = patches.UserCode(preprocess=f"{prep}:preprocess", outputs=frozenset({"input_ids", "attention_mask"}))
    change = Change("cast-inputs", "input_ids", "int64", "float32", "preprocess")
    plan = patches.plan_patch([Step("cast-inputs", "applied", "", (change,))], code=code, device_type="cpu",
                              model_dtype="float32", root=tmp_path)
    reruns: list[Change | None] = []

    def verify(texts, change, *, transform=None):
        reruns.append(change)
        if change is not None and ".astype(np.int64)" in texts[prep.resolve()]:
            return "does not run: preprocess function prep.py:preprocess raised KeyError: 'x'"
        return None

    out = patches.write(plan, tmp_path / "fix.patch", root=tmp_path, force=False, verify=verify)
    assert [(e.codemod, e.status) for e in out.edits] == [("RetargetCast", "failed"), ("CastReturnedValue", "applied")]
    assert "re-run: does not run" in out.edits[0].detail
    assert out.path and reruns == [change, change, None]  # each attempt, then the whole patch

    def fails_whole(texts, change, *, transform=None):
        return None if change is not None else "still has 1 finding(s) at or above error, first DD103: …"

    (tmp_path / "fix.patch").unlink()
    out = patches.write(plan, tmp_path / "fix.patch", root=tmp_path, force=False, verify=fails_whole)
    assert out.path is None and not (tmp_path / "fix.patch").exists()
    assert out.skipped == "the patched pipeline was re-run and still has 1 finding(s) at or above error, first DD103: …"


def test_a_fix_module_transform_that_fails_leaves_apply_fix_and_says_scan_cannot_check_it(tmp_path: Path) -> None:
    from dtype_doctor.fix import patches
    from dtype_doctor.fix.outcome import Step

    code = patches.UserCode(transform={"kind": "audio", "column": "audio"}, scan=("dtype-doctor", "scan", "m", "d"))
    change = Change("cast-inputs", "input_values", "bfloat16", "float32", "processor")
    plan = patches.plan_patch([Step("cast-inputs", "applied", "", (change,))], code=code, device_type="cpu",
                              model_dtype="bfloat16", root=tmp_path)

    def verify(texts, change, *, transform=None):
        assert (transform is not None) == ("\ndef preprocess(" in texts[tmp_path / "dtype_doctor_fix.py"])
        return "does not run: TypeError: Got unsupported ScalarType BFloat16" if transform is not None else None

    out = patches.write(plan, tmp_path / "fix.patch", root=tmp_path, force=False, verify=verify)
    assert [(e.codemod, e.status) for e in out.edits] == [("NewFixModule", "failed"), ("NewFixModule", "applied")]
    assert out.path and out.check is None and "scan cannot check" in out.notes[0]
    assert "def preprocess(" not in (tmp_path / "fix.patch").read_text()
