"""DD406 checkpoint-dtype-differs, and `scan --checkpoint PATH`: the saved dtypes read without loading the
tensors (a safetensors header, a torch checkpoint loaded with weights_only=True onto the meta device, a
DCP folder's metadata) and compared with the model; under `run`, a model's load_state_dict that casts.
The plain load first: load_state_dict rounds float32 weights into a bfloat16 model, silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from dtype_doctor.cli.main import run as cli
from dtype_doctor.load.checkpoint import saved_dtypes
from dtype_doctor.run.runner import run_script

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "fixtures/models/llama-tiny"
DATA = ROOT / "fixtures/data/lm-text"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("ckpt")
    fp32 = AutoModelForCausalLM.from_pretrained(LLAMA, dtype=torch.float32)
    fp32.save_pretrained(folder / "hf")
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in fp32.state_dict().items()}, "iter_num": 3}, folder / "ckpt.pt")
    bf16 = AutoModelForCausalLM.from_pretrained(LLAMA, dtype=torch.bfloat16)
    dcp.save({"model": bf16.state_dict()}, checkpoint_id=str(folder / "dcp"))
    return {"safetensors": folder / "hf" / "model.safetensors", "torch": folder / "ckpt.pt", "dcp": folder / "dcp"}


def test_the_plain_load_rounds_float32_weights_into_a_bfloat16_model() -> None:
    saved = nn.Linear(4, 4).state_dict()
    model = nn.Linear(4, 4).to(torch.bfloat16)
    model.load_state_dict(saved)  # no error, no warning
    assert model.weight.dtype == torch.bfloat16 and not torch.equal(model.weight.float(), saved["weight"])


def test_the_saved_dtypes_are_read_without_loading(checkpoints: dict[str, Path]) -> None:
    assert saved_dtypes(str(checkpoints["safetensors"])).format == "safetensors"
    for kind, dtype in (("safetensors", "float32"), ("torch", "float32"), ("dcp", "bfloat16")):
        saved = saved_dtypes(str(checkpoints[kind]))
        assert saved.format == kind and {d for _, d in saved.tensors} == {dtype} and len(saved.tensors) >= 20


@pytest.mark.parametrize("kind, dtype, expect", [("safetensors", "bfloat16", "warning"), ("torch", "bfloat16", "warning"),
                                                 ("dcp", "float32", "info"), ("torch", "float32", None)])
def test_scan_checkpoint_compares_the_saved_dtypes_with_the_model(kind: str, dtype: str, expect: str | None,
                                                                   checkpoints: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli(["scan", str(LLAMA), str(DATA), "--dtype", dtype, "--checkpoint", str(checkpoints[kind]), "-f", "json"])
    report = json.loads(capsys.readouterr().out)
    found = [f for f in report["findings"] if f["code"] == "DD406"]
    assert report["checkpoint"]["format"] == kind
    if expect is None:
        assert found == []  # saved float32 under torch.compile's _orig_mod. names, scanned float32: alike
        return
    (f,) = found
    assert f["severity"] == expect and f"as {'bfloat16' if kind == 'dcp' else 'float32'}" in f["message"]


def test_a_bad_checkpoint_path_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        cli(["scan", str(LLAMA), str(DATA), "--checkpoint", str(tmp_path / "missing.pt")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--checkpoint" in err and "Traceback" not in err


def test_run_names_a_model_load_that_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save(nn.Linear(8, 2).state_dict(), tmp_path / "w.pt")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\n\nmodel = nn.Linear(8, 2).to(torch.bfloat16)\n"
        "model.load_state_dict(torch.load('w.pt', weights_only=True))\n"
        "model(torch.randn(3, 8, dtype=torch.bfloat16)).float().sum().backward()\n")
    result = run_script(["python", "train.py"])
    (f,) = [f for f in result.report.findings if f.code == "DD406"]
    assert f.severity == "warning" and (f.source.file, f.source.line) == ("train.py", 5) and "2 float32" in f.message
