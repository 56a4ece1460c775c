"""`--gpu`: the GPU a simulated CUDA trace targets, recorded in the report's target."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_cli import cli

ROOT = Path(__file__).resolve().parents[1]
MODEL, DATA = ROOT / "fixtures/models/bert-tiny", ROOT / "fixtures/data/text-cls"


@pytest.mark.parametrize("gpu, refused", [("t4", True), ("a100", False)])
def test_bf16_on_a_gpu_before_ampere_is_dd107(capsys: pytest.CaptureFixture[str], gpu: str, refused: bool) -> None:
    r = cli(capsys, "scan", MODEL, DATA, "--simulate", "--device", "cuda", "--dtype", "bfloat16", "--gpu", gpu, "--format", "json")
    report = r.json()
    assert report["target"]["gpu"].startswith(gpu) and report["target"]["simulated"] is True
    assert ("DD107" in [f["code"] for f in report["findings"]]) is refused
    assert r.code == (1 if refused else 0)


@pytest.mark.parametrize("argv, words", [(["--gpu", "t4"], "--simulate"), (["--simulate", "--gpu", "p100x"], "compute capability")])
def test_bad_gpu_use_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    r = cli(capsys, "scan", MODEL, DATA, *argv)
    assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1
