"""`--gpu`: the GPU a simulated CUDA trace targets, recorded in the report's target."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli import cli

ROOT = Path(__file__).resolve().parents[1]
MODEL, DATA = ROOT / "fixtures/models/bert-tiny", ROOT / "fixtures/data/text-cls"


@pytest.mark.parametrize("gpu, slow", [("t4", True), ("v100", True), ("a100", False)])
def test_bf16_on_a_gpu_before_ampere_runs_slowly(capsys: pytest.CaptureFixture[str], gpu: str, slow: bool) -> None:
    """bf16 matmul runs before compute capability 8.0, emulated (op_db lists bf16 mm/addmm/linear
    for CUDA; pytorch/pytorch#124996): a DD107 warning, not an error, and exit code 0."""
    r = cli(capsys, "scan", MODEL, DATA, "--simulate", "--device", "cuda", "--dtype", "bfloat16", "--gpu", gpu, "--format", "json")
    report = r.json()
    assert report["target"]["gpu"].startswith(gpu) and report["target"]["simulated"] is True
    dd107 = [f for f in report["findings"] if f["code"] == "DD107"]
    assert {f["severity"] for f in dd107} == ({"warning"} if slow else set())
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert r.code == 0


@pytest.mark.parametrize("argv, words", [(["--gpu", "t4"], "--simulate"), (["--simulate", "--gpu", "p100x"], "compute capability")])
def test_bad_gpu_use_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    r = cli(capsys, "scan", MODEL, DATA, *argv)
    assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1
