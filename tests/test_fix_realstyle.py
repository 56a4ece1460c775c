"""`fix --run --write-patch` on real-style training scripts (tests/scripts/realstyle/), one bug injected
each, on this CPU and under `--simulate --gpu t4`: the patch goes where the bug is, `git apply`
takes it, and the script then runs clean under the same check. Where the bug is one the CPU
really has, PyTorch is the oracle: plain `python` dies of it before, and runs after.

The scripts: a GPT trainer with its own model.py (in the style of nanoGPT), an accelerate loop
over a tiny BERT (accelerate's nlp_example), a Trainer(fp16=...) script, and a plain
nn.Sequential loop (tests/helpers_realstyle.py injects the bugs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import helpers_realstyle as rs
from dtype_doctor.cli.main import run

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class Case:
    bugs: tuple[rs.Bug, ...]
    script: rs.Script
    where: str  # "cpu" (a real run) or a simulated GPU
    codes: tuple[str, ...]  # the error findings before
    patched: str  # the file the patch changes
    lines: tuple[str, ...]  # lines the patch adds or removes
    says: str = ""  # what the finding says, in the user's words

    @property
    def machine(self) -> list[str]:
        return [] if self.where == "cpu" else ["--simulate", "--gpu", self.where]


INT32 = ("+    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])",)
SEQ = ("+        loss = loss_fn(model(x.to(next(model.parameters()).dtype)), y)",)
CASES = {
    "int32-targets@cpu": Case((rs.INT32_TARGETS,), rs.GPT, "cpu", ("DD104",), "gpt/train.py", INT32),
    "int32-targets@t4": Case((rs.INT32_TARGETS,), rs.GPT, "t4", ("DD104",), "gpt/train.py", INT32),
    "arange-without-device@t4": Case(
        (rs.ARANGE_NO_DEVICE,), rs.GPT, "t4", ("DD201",), "gpt/model.py",
        ("+        pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)",), "torch.arange at model.py:",
    ),
    "targets-never-moved@t4": Case(
        (rs.TARGETS_NOT_MOVED,), rs.GPT, "t4", ("DD201",), "gpt/train.py",
        ("+        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)",),
    ),
    "half-model-under-accelerate-fp16@t4": Case(
        (rs.ACCELERATE_HALF,), rs.ACCELERATE, "t4", ("DD401",), "accelerate_nlp.py", ("-    model.half()  # fp16 weights to save memory",),
    ),
    "half-load-under-trainer-fp16@t4": Case(
        (rs.TRAINER_HALF_LOAD,), rs.TRAINER, "t4", ("DD401",), "trainer_classify.py",
        ("+model = AutoModelForSequenceClassification.from_pretrained(model_dir)",),
    ),
    "float-ids-in-map@cpu": Case(
        (rs.FLOAT_IDS_IN_MAP,), rs.ACCELERATE, "cpu", ("DD103",), "accelerate_nlp.py",
        ('+        out["input_ids"] = [[int(t) for t in ids] for ids in out["input_ids"]]',), "input_ids made of float32 values",
    ),
    "half-sequential@cpu": Case((rs.SEQUENTIAL_HALF,), rs.SEQUENTIAL, "cpu", ("DD101",), "sequential_loop.py", SEQ),
    "half-sequential@t4": Case((rs.SEQUENTIAL_HALF,), rs.SEQUENTIAL, "t4", ("DD101",), "sequential_loop.py", SEQ),
}


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _python(cwd: Path, script: rs.Script) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *script.argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def _tree(root: Path) -> str:
    """The working tree as git sees it: the user's files, byte for byte."""
    return subprocess.run(["git", "diff", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout


def _errors(report: dict) -> list[str]:
    return sorted({f["code"] for f in report["findings"] if f["severity"] == "error"})


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_patch_applies_and_the_script_runs_clean(name: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[name]
    root = rs.workspace(tmp_path / "project", *case.bugs)
    cwd = root / case.script.cwd
    monkeypatch.chdir(cwd)
    if case.where == "cpu":
        assert _python(cwd, case.script).returncode != 0, "the bug is real on this CPU: plain python dies of it"
    before = _tree(root)
    code, out, err = _cli(["fix", "--run", *case.machine, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                           *case.script.command()], capsys)
    report = json.loads(out)
    fix = report["fix"]
    assert code == 0 and fix["verified"] is True, (err[-2000:], fix)
    assert _errors(report) == list(case.codes), report["findings"]
    if case.says:
        assert any(case.says in f["message"] for f in report["findings"]), report["findings"]
        assert not any("aten." in x["description"] for f in report["findings"] for x in f["fixes"])
    assert fix["patch"]["files"] == [case.patched] and _tree(root) == before  # the patch, never the user's files
    patch = (root / "fix.patch").read_text()
    for line in case.lines:
        assert line in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, out, err = _cli(["run", *case.machine, "-f", "json", "--", *case.script.command()], capsys)
    assert code == 0 and _errors(json.loads(out)) == [], out
    if case.where == "cpu":
        done = _python(cwd, case.script)
        assert done.returncode == 0, done.stderr[-2000:]


def test_a_patch_holds_every_verified_edit_and_lists_what_remains(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # int32 targets, which an edit fixes, and half weights under the GradScaler made in a helper that
    # returns the model converted by a dtype in a variable, which no edit of the doctor's can undo.
    root = rs.workspace(tmp_path / "project", rs.INT32_TARGETS, rs.GPT_HALF_IN_BUILDER)
    monkeypatch.chdir(root / "gpt")
    t4 = ["--simulate", "--gpu", "t4"]
    code, out, err = _cli(["fix", "--run", *t4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--", *rs.GPT_FP16.command()], capsys)
    report = json.loads(out)
    fix = report["fix"]
    assert code == 1 and fix["verified"] is False and _errors(report) == ["DD104", "DD401"]
    assert [s["strategy"] for s in fix["applied"] if s["status"] == "applied"] == ["cast-inputs"]
    (left,) = fix["remaining"]
    assert left["code"] == "DD401" and left["why"].startswith("no edit of your files expresses it: ")
    assert "binds no model to keep float32" in left["why"]  # each way out, and why it could not be written
    assert fix["patch"]["path"] and "unwritten" not in fix["patch"]  # every verified change is in it
    patch = (root / "fix.patch").read_text()
    assert INT32[0] in patch and "ptdtype" not in patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, out, err = _cli(["run", *t4, "-f", "json", "--", *rs.GPT_FP16.command()], capsys)
    assert code == 1 and _errors(json.loads(out)) == ["DD401"]  # what the fix said remains, and only that


def test_a_clean_run_has_nothing_to_fix(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch.arange without device= is a GPU's bug: on this CPU the script is clean.
    root = rs.workspace(tmp_path / "project", rs.ARANGE_NO_DEVICE)
    monkeypatch.chdir(root / "gpt")
    code, out, err = _cli(["fix", "--run", "--write-patch", str(root / "fix.patch"), "-f", "rich", "--", *rs.GPT.command()], capsys)
    last = " ".join(out.strip().split("\n\n")[-1].split())
    assert code == 0 and last.startswith("✓ nothing to fix: 0 errors") and "fixed and verified" not in out, out
    assert err.strip().splitlines()[-1] == "dtype-doctor: no patch written: nothing to fix"
    assert not (root / "fix.patch").exists()


def test_without_write_patch_the_fix_is_verified_in_memory(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = rs.workspace(tmp_path / "project", rs.SEQUENTIAL_HALF)
    monkeypatch.chdir(root)
    before = _tree(root)
    code, out, err = _cli(["fix", "--run", "--simulate", "-f", "rich", "--", *rs.SEQUENTIAL.command()], capsys)
    last = " ".join(out.strip().split("\n\n")[-1].split())
    assert code == 0 and last.startswith("✓ verified in memory — pass --write-patch to write it: 0 errors"), out
    assert "fixed and verified" not in out and _tree(root) == before


def test_an_edit_that_breaks_the_script_is_the_doctors_failure(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # The edit the doctor once wrote for an nn.Sequential: model.dtype, which only transformers' models have.
    from dtype_doctor.fix.codemods import forward

    written = forward.CastBatch._apply

    def as_it_was(self, source, filename, warnings):  # noqa: ANN001, ANN202
        text, detail = written(self, source, filename, warnings)
        return text.replace("next(model.parameters()).dtype", "model.dtype"), detail

    monkeypatch.setattr(forward.CastBatch, "_apply", as_it_was)
    root = rs.workspace(tmp_path / "project", rs.SEQUENTIAL_HALF)
    monkeypatch.chdir(root)
    code, out, err = _cli(["fix", "--run", "--write-patch", str(root / "fix.patch"), "--", *rs.SEQUENTIAL.command()], capsys)
    assert code == 3 and out == "" and not (root / "fix.patch").exists()
    assert "+        loss = loss_fn(model(x.to(model.dtype)), y)" in err  # the edit, shown
    line = err.strip().splitlines()[-1]
    assert "the doctor's own edit broke the script (CastBatch on sequential_loop.py" in line
    assert "AttributeError: 'Sequential' object has no attribute 'dtype'" in line


def test_an_edit_the_rerun_rejects_is_shown_and_the_next_is_tried(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A first edit that moves the targets to the wrong device: written, run again, rejected.
    from dtype_doctor.fix.codemods import MoveWhereHandled
    from dtype_doctor.fix.patches import Attempt
    from dtype_doctor.fix.strategies.to_device import ToDevice

    planned = ToDevice.edits

    def wrong_first(self, c, site):  # noqa: ANN001, ANN202
        attempts = planned(self, c, site)
        first = attempts[0]
        return [Attempt(first.file, MoveWhereHandled(first.codemod.line, device_expr='"cpu"')), *attempts]

    monkeypatch.setattr(ToDevice, "edits", wrong_first)
    root = rs.workspace(tmp_path / "project", rs.TARGETS_NOT_MOVED)
    monkeypatch.chdir(root / "gpt")
    code, out, err = _cli(["fix", "--run", "--simulate", "--gpu", "t4", "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                           *rs.GPT.command()], capsys)
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["verified"] is True, fix
    assert [(s["strategy"], s["status"]) for s in fix["applied"]] == [("to-device", "failed"), ("to-device", "applied")]
    (rejected,) = fix["rejected"]
    assert '+        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to("cpu")' in rejected["diff"]
    assert rejected["rerun"].startswith("DD201 is still reported: GPT: targets is on cpu")
    patch = (root / "fix.patch").read_text()
    assert '"cpu"' not in patch and "y.pin_memory().to(device, non_blocking=True)" in patch


def test_a_half_dtype_loaded_by_name_is_named_where_it_was_chosen(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # `from_pretrained(..., dtype=load_dtype)`: the line that chose float16 is the assignment, not the load.
    root = rs.workspace(tmp_path / "project", rs.TRAINER_HALF_LOAD_BY_NAME)
    monkeypatch.chdir(root)
    code, out, err = _cli(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", *rs.TRAINER.command()], capsys)
    report = json.loads(out)
    line = next(i for i, text in enumerate((root / "trainer_classify.py").read_text().splitlines(), 1) if text.startswith("load_dtype ="))
    half = [f for f in report["findings"] if f["code"] == "DD401"]
    assert code == 1 and half and half[0]["source"] == {"file": "trainer_classify.py", "line": line}, report["findings"]


def test_a_dtype_chosen_in_an_if_else_is_not_named_at_the_branch_that_did_not_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The last assignment in the file is the float32 branch; the load ran float16: the load's line is named, not it.
    bug = rs.Bug("trainer_classify.py", "model = AutoModelForSequenceClassification.from_pretrained(model_dir)",
                 "if True:\n    load_dtype = torch.float16\nelse:\n    load_dtype = torch.float32\n"
                 "model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=load_dtype)")
    root = rs.workspace(tmp_path / "project", bug)
    monkeypatch.chdir(root)
    code, out, err = _cli(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", *rs.TRAINER.command()], capsys)
    report = json.loads(out)
    lines = (root / "trainer_classify.py").read_text().splitlines()
    load = next(i for i, text in enumerate(lines, 1) if "dtype=load_dtype" in text)
    half = [f for f in report["findings"] if f["code"] == "DD401"]
    assert code == 1 and half and half[0]["source"] == {"file": "trainer_classify.py", "line": load}, report["findings"]
