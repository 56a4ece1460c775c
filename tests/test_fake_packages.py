"""CUDA-only packages under `--simulate` (machine/fake_packages.py): flash-attn as the target has it.

The plain load stops on this machine: test_attention.py::test_transformers_refuses_flash_attention_here
shows transformers refusing flash_attention_2 without the package. A GPU machine has the package, and there
flash-attn itself refuses a T4 ("FlashAttention only supports Ampere GPUs or newer.") and float32
("FlashAttention only support fp16 and bf16 data type"), csrc/flash_attn/flash_api.cpp mha_fwd. Under
`run --simulate` the load goes through, the fake raises flash-attn's refusal at the first forward, and
DD701/DD702 give the verdict (not DD001); an A100 in bfloat16 trains.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from dtype_doctor.machine.fake_packages import CudaOnlyPackages

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "flash_attn_train.py"
LLAMA = REPO / "fixtures" / "models" / "llama-tiny"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is really installed")


def test_flash_attn_exists_only_inside_the_simulation() -> None:
    from transformers.utils import import_utils

    assert not import_utils.is_flash_attn_2_available()  # asked (and cached) before the simulation
    with CudaOnlyPackages():
        assert importlib.util.find_spec("flash_attn") is not None
        assert importlib.metadata.version("flash-attn") == "2.8.3"
        assert "flash-attn" in importlib.metadata.packages_distributions()["flash_attn"]
        from flash_attn import flash_attn_func, flash_attn_varlen_func  # what transformers imports
        from flash_attn.bert_padding import pad_input, unpad_input

        assert callable(flash_attn_func) and callable(flash_attn_varlen_func) and callable(pad_input) and callable(unpad_input)
        # diffusers' attention dispatch imports these two by name (diffusers/models/attention_dispatch.py): an
        # import that fails there prints "flash_attn is installed but failed to import" and drops the backend.
        from flash_attn.flash_attn_interface import _wrapped_flash_attn_backward, _wrapped_flash_attn_forward

        with pytest.raises(RuntimeError, match="_wrapped_flash_attn_forward is not simulated"):
            _wrapped_flash_attn_forward()
        assert callable(_wrapped_flash_attn_backward)
    assert importlib.util.find_spec("flash_attn") is None and "flash_attn" not in sys.modules
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("flash-attn")
    assert not import_utils.is_flash_attn_2_available()  # no cached answer from inside is left


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(SCRIPT, tmp_path / "flash_attn_train.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(gpu: str, dtype: str, capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "--gpu", gpu, "-f", "json", "--", "python", "flash_attn_train.py", str(LLAMA), dtype])
    captured = capsys.readouterr()
    return exit_info.value.code, json.loads(captured.out), captured.err


def _errors(report: dict) -> list[str]:
    return sorted(f["code"] for f in report["findings"] if f["severity"] == "error")


@pytest.mark.parametrize(("gpu", "dtype", "code", "words"), [
    ("t4", "float16", "DD702", "FlashAttention only supports Ampere GPUs or newer."),
    ("a100", "float32", "DD701", "FlashAttention only support fp16 and bf16 data type"),
])
def test_flash_attention_refused_by_the_target(gpu: str, dtype: str, code: str, words: str, here: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    exit_code, report, err = _run(gpu, dtype, capsys)
    assert exit_code == 1 and _errors(report) == [code]  # flash-attn's own stop, explained by the rule, not DD001
    assert f"raised RuntimeError at flash_attn_train.py:14: {words}" in err
    assert report["target"]["attention"]["implementation"] == "flash_attention_2"


def test_flash_attention_in_bfloat16_on_an_a100_trains(here: Path, capsys: pytest.CaptureFixture) -> None:
    exit_code, report, err = _run("a100", "bfloat16", capsys)
    assert "trained one step" in err and _errors(report) == []
    assert not any(f["code"] in ("DD701", "DD702", "DD001") for f in report["findings"])
    assert report["coverage"]["phases"]["backward"]


def test_a_cuda_only_package_not_faked_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    if importlib.util.find_spec("apex") is not None:
        pytest.skip("apex is installed")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "uses_apex.py").write_text("import torch\nimport apex.optimizers\n")
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "--", "python", "uses_apex.py"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "No module named 'apex'" in err and "CUDA-only package that --simulate does not simulate" in err
