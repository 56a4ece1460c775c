"""The fix --run loop on its records, with the script's runs stood in for: the same findings are
compared before and after, and a finding the re-run has that the first run did not is named as
new, with why, never counted as one the fix left."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtype_doctor.records import Finding, Remedy, Report, SourceLoc, Target, TensorMeta
from dtype_doctor.run import fix as loop
from dtype_doctor.run.command import ScriptCommand
from dtype_doctor.run.runner import RunOptions, RunResult

SCRIPT = "import torch\nlabels = torch.tensor([0, 1], dtype=torch.int32)\n"


def _finding(code: str, message: str, remedies: tuple[Remedy, ...] = (), tensors: tuple[TensorMeta, ...] = ()) -> Finding:
    return Finding(code, code.lower(), "error", message, tensors=tensors, remedies=remedies)


def _result(command: ScriptCommand, *findings: Finding) -> RunResult:
    report = Report(findings=findings, target=Target("s.py", None, None, "cpu", False, "float32", None, True), environment={})
    return RunResult(command, report, None, 1)  # type: ignore[arg-type]


def test_a_finding_new_in_the_rerun_is_named_with_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    command = ScriptCommand("file", str(script), ())
    labels = TensorMeta("int32", "cpu", (2,), "target", "labels", "input:labels")
    int32 = _finding("DD104", "labels is int32", (Remedy("cast-inputs", "labels", "int64", "preprocess", SourceLoc("s.py", 2)),), (labels,))
    scaler = _finding("DD401", "2 trainable parameters are float16", (Remedy("fp32-trainable", "trainable", "float32"),))
    runs = [_result(command, int32), _result(command, scaler), _result(command, scaler)]
    texts: list[dict] = []

    def run_script(command, *, options, sources=None):  # noqa: ANN001, ANN202
        texts.append(dict(sources or {}))
        return runs[len(texts) - 1]

    monkeypatch.setattr(loop, "run_script", run_script)
    report = loop.fix_script(command, RunOptions(), write_patch=tmp_path / "fix.patch")
    fix = report.fix
    assert fix is not None and fix.verified is False
    assert [(s.strategy, s.status) for s in fix.steps if s.status != "skipped"] == [("cast-inputs", "applied")]
    assert "dtype=torch.int64" in texts[1][str(script)]  # the re-run ran the edited text, the file untouched
    assert script.read_text() == SCRIPT
    assert fix.remaining == () and [(n.code, n.why) for n in fix.new] == [
        ("DD401", "it appeared with the edits (cast labels int32 → int64)")
    ]
    assert fix.patch is not None and fix.patch.path and "+labels = torch.tensor([0, 1], dtype=torch.int64)" in (tmp_path / "fix.patch").read_text()
    assert fix.headline == "partly fixed: the verified edits are in the patch"
    assert fix.to_dict()["new"][0]["why"].startswith("it appeared with the edits")


def test_the_same_finding_is_the_same_whatever_its_counts_say() -> None:
    trainable = (Remedy("fp32-trainable", "trainable", "float32"),)
    assert loop.finding_key(_finding("DD401", "41 trainable parameters are float16", trainable)) == loop.finding_key(
        _finding("DD401", "16 trainable parameters are float16", trainable))
