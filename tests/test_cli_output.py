"""What the CLI prints, read as a user reads it: piped, at 80 columns, pasted back into a shell."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.records import LineageStep, Report, Target
from dtype_doctor.report import render

ROOT = Path(__file__).resolve().parent.parent
DEMO = ("fixtures/demo/model", "fixtures/demo/data")


def cli(*argv: str, columns: int | None = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "dtype_doctor", *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )


@pytest.fixture(scope="module")
def scan80() -> str:
    return cli("scan", *DEMO).stdout


def test_piped_output_honours_columns_and_has_no_trailing_spaces(scan80: str) -> None:
    lines = scan80.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []
    wide = cli("scan", *DEMO, columns=130).stdout.splitlines()
    assert max(len(line) for line in wide) > 100  # the 100-column default did not win


def test_identifiers_are_not_cut_mid_word_at_80_columns(scan80: str) -> None:
    assert "ResNetForImageClassification.forward(pixel_values=…)" in scan80
    assert "ResNetForImageClassification.forward(labels=…)" in scan80


def test_rules_at_80_columns_keep_each_summary_to_a_few_lines() -> None:
    out = cli("rules").stdout
    blocks = [b for b in re.split(r"\n\s*\n", out.split("─\n", 1)[1]) if b.strip()]
    assert blocks and all(re.match(r"DD\d{3}\s", b.strip()) for b in blocks)
    assert max(len(b.strip().splitlines()) for b in blocks) <= 4  # the code line + at most 3 of summary
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize("command", ["scan", "fix"])
def test_help_usage_and_examples_paste_as_written(command: str) -> None:
    out = cli(command, "--help").stdout
    assert f"Usage: dtype-doctor {command} [OPTIONS] MODEL DATASET" in out
    assert "{" not in out.split("Options:")[0] and "<str>" not in out
    examples = out.split("Examples:", 1)[1]
    joined = re.sub(r"\\\n\s*", "", examples)  # shell line continuations
    commands = [line.strip() for line in joined.splitlines() if line.strip().startswith("dtype-doctor")]
    assert len(commands) == {"scan": 5, "fix": 3}[command]  # scan: a diffusers pipeline folder, a checkpoint too
    for line in examples.splitlines():
        assert len(line) <= 80 and not re.search(r"-$", line.rstrip(" \\")), line
    for c in commands:  # every option an example uses is one the command has
        for option in re.findall(r"\s(--[a-z-]+)", c):
            assert option in out, (c, option)


def test_fix_ends_on_the_outcome_and_json_says_which_summary_is_which() -> None:
    out = cli("fix", *DEMO).stdout
    last = " ".join(out.strip().split("\n\n")[-1].split())  # the last paragraph, however wrapped
    # nothing was written without --write-patch: the outcome says where the fix lives
    assert last.startswith("✓ verified in memory — pass --write-patch to write it: 0 errors"), last
    assert last.endswith("(before: 1 error, 0 warnings, 0 info)")
    report = json.loads(cli("fix", *DEMO, "--format", "json").stdout)
    assert report["summary"]["error"] == 1  # the pipeline as scanned
    assert report["fix"]["before"]["summary"] == report["summary"]
    assert report["fix"]["after"]["summary"]["error"] == 0


def test_a_stage_without_a_dtype_shows_no_shape() -> None:
    target = Target("m", "d", "train", "cpu", False, "float32", None, False)
    from dtype_doctor.records import ModelInfo, Trace

    trace = Trace(
        ops=(), modules=(), model=ModelInfo("M", ()), inputs=(),
        lineage={"labels": (LineageStep("preprocess", None, None, ()), LineageStep("collator", "int64", "cpu", (2,)))},
    )
    text = render(Report((), target, {}, trace), "rich", width=80)
    assert "—[]" not in text and "int64@cpu[2]" in text


def test_the_fp32_trainable_fix_reads_as_english() -> None:
    from dtype_doctor.fix.strategies import Change, describe

    text = describe(Change("fp32-trainable", "trainable", "float32", "float16"))
    assert text == "keep the trainable parameters in float32 (were float16)"
