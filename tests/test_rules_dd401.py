"""DD401 grad-scaler-half-gradients, against the real torch.amp.GradScaler."""

import pytest
import torch
import torch.nn as nn

import dtype_doctor


def scaler_step(model: nn.Module, x: torch.Tensor) -> None:
    """One AMP step as the recipe writes it: autocast(fp16) forward, scaled backward, unscale."""
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def test_fp16_trainable_weights_under_fp16_autocast() -> None:
    model, x = nn.Linear(4, 2).half(), torch.randn(3, 4)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler_step(model, x)
    model.zero_grad(set_to_none=True)
    report = dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16")
    [f] = [f for f in report.findings if f.code == "DD401"]
    assert f.severity == "error" and f.stage == "optimizer"
    assert {t.name for t in f.tensors} == {"weight", "bias"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_what_grad_scaler_accepts_is_not_reported(dtype: torch.dtype) -> None:
    model, x = nn.Linear(4, 2).to(dtype), torch.randn(3, 4)
    scaler_step(model, x)  # runs
    model.zero_grad(set_to_none=True)
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16"))


def test_only_training_with_fp16_autocast_is_judged() -> None:
    model, x = nn.Linear(4, 2).half(), torch.randn(3, 4).half()
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, train=True))  # no AMP: no scaler
    assert "DD401" not in codes(dtype_doctor.diagnose(model, {"input": x}, autocast="float16"))  # inference


def test_bf16_gradients_are_refused_on_a_simulated_cuda_target_only() -> None:
    """The CPU unscale kernel implements bfloat16 (shown by scaler_step above running); the
    CUDA one does not, so a CUDA target with bf16 trainables under fp16 AMP is an error."""
    model, x = nn.Linear(4, 2).to(torch.bfloat16), torch.randn(3, 4)
    scaler_step(model, x)  # runs on this CPU
    model.zero_grad(set_to_none=True)
    report = dtype_doctor.diagnose(model, {"input": x}, train=True, autocast="float16", simulate=True, device="cuda")
    [f] = [f for f in report.findings if f.code == "DD401"]
    assert "BFloat16" in f.message and f.severity == "error"


HALF_LOAD_SCRIPT = """\
import sys
import torch
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], dtype=torch.float16)
opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
for _ in range(2):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([1])).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""


def test_run_names_the_from_pretrained_line_that_loaded_the_half_weights(tmp_path, monkeypatch, capsys) -> None:
    """No .half() to blame: the weights came half from from_pretrained(dtype=torch.float16), and
    that line is where the fix goes."""
    import json
    import runpy
    import sys
    from pathlib import Path

    from dtype_doctor.cli.main import run

    model_dir = str(Path(__file__).resolve().parents[1] / "fixtures" / "models" / "bert-tiny")
    script = tmp_path / "train.py"
    script.write_text(HALF_LOAD_SCRIPT)
    monkeypatch.setattr(sys, "argv", [str(script), model_dir])
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        runpy.run_path(str(script), run_name="__main__")
    with pytest.raises(SystemExit):
        run(["run", "--format", "json", "--", str(script), model_dir])
    report = json.loads(capsys.readouterr().out)
    [f] = [f for f in report["findings"] if f["code"] == "DD401"]
    assert f["source"]["line"] == 4 and Path(f["source"]["file"]).name == "train.py"
