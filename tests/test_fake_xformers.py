"""xFormers under `--simulate` (machine/fake_xformers.py).

It does not install on this CPU runner (its CUDA kernels build beside a CUDA toolkit), so a script that imports it
stops at its import here, where the GPU machine it is meant for runs it. Under the simulation it is installed as the
target has it: its memory-efficient attention runs torch's copy of its CUTLASS kernel after the checks xFormers'
dispatch makes (bfloat16 only from compute capability 8.0, xformers/ops/fmha/cutlass.py).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from helpers_cli import run_json as _run

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(SCRIPTS / "xformers_attention.py", tmp_path / "xformers_attention.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.skipif(importlib.util.find_spec("xformers") is not None, reason="xformers is really installed")
def test_xformers_attention_runs_where_the_target_runs_it_and_is_refused_where_it_refuses(
        here: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ImportError):  # the plain script stops at its import on this machine
        importlib.import_module("xformers.ops")
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--",
                              "python", "xformers_attention.py", "float16"], capsys)
    assert code == 0 and "ok (2, 8, 2, 8)" in err, err[-2000:]
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert report["coverage"]["phases"]["backward"] is True
    # A T4 (compute capability 7.5) in bfloat16: xFormers' dispatch finds no operator, in its own words.
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--",
                              "python", "xformers_attention.py", "bfloat16"], capsys)
    assert code == 1 and "No operator found for `memory_efficient_attention_forward`" in err, err[-2000:]
