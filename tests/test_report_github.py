"""`--format github`: one workflow-command annotation per finding, escaped as GitHub requires."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.cli.main import run
from dtype_doctor.records import Finding, SourceLoc
from dtype_doctor.report import render

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^::(error|warning|notice)(?: ([^:]*))?::(.*)$")


def _unescape(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


def test_a_real_mismatch_becomes_one_error_annotation():
    model = nn.Linear(4, 4).half()
    report = dtype_doctor.diagnose(model, {"input": torch.randn(2, 4)})
    [line, summary] = render(report, "github").splitlines()
    level, props, message = COMMAND.match(line).groups()
    assert level == "error" and "title=DD101 dtype-mismatch-in-op" in props
    assert "\n" not in line and "pytorch: " in _unescape(message)
    assert summary.startswith("1 error")


def test_severities_files_and_escaping():
    from dataclasses import replace

    base = dtype_doctor.diagnose(nn.Linear(4, 4), {"input": torch.randn(2, 4)})
    odd = "50% done: a, b\nsecond line"
    findings = (
        Finding("DD104", "loss-target-dtype", "warning", odd, source=SourceLoc("user/prep, v2.py", 7)),
        Finding("DD108", "implicit-cast", "info", "cast"),
    )
    text = render(replace(base, findings=findings), "github")
    warning, notice, _ = text.splitlines()
    level, props, message = COMMAND.match(warning).groups()
    assert level == "warning" and "file=user/prep%2C v2.py,line=7" in props
    assert _unescape(message).startswith(odd)
    assert COMMAND.match(notice).group(1) == "notice" and "file=" not in notice


def test_cli_format_github_keeps_the_exit_code(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as done:
        run(["scan", str(ROOT / "fixtures/demo/model"), str(ROOT / "fixtures/demo/data"), "--format", "github"])
    out = capsys.readouterr().out.splitlines()
    assert done.value.code == 1
    assert [COMMAND.match(line).group(1) for line in out[:-1]] == ["error"]
    assert "title=DD101" in out[0]
