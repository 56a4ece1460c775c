"""Device problems made in model code name the user's line and carry a patch, and the first one does
not end the trace.

- An LSTM's zero state made in forward with `torch.zeros(...)` without device= (the shape of
  pytorch/examples word_language_model, tests/scripts/realstyle/word_lm --fresh-hidden): on a GPU
  ATen refuses it in the composite kernel before any op is dispatched (aten/src/ATen/native/RNN.cpp,
  check_attributes: "Input and hidden tensors are not at the same device").
- RoPE tables kept as plain attributes (meta-llama's `self.freqs_cis = precompute_freqs_cis(...)`,
  tests/scripts/realstyle/llama_rope with its forward's `.to(h.device)` dropped): `model.to()` leaves
  them on the CPU; the patch registers them as non-persistent buffers in `__init__`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent / "scripts" / "realstyle"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1"}


def _doctor(cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtype_doctor", *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_plain_tensor_attributes_stay_behind_and_an_rnn_refuses_a_hidden_state_elsewhere() -> None:
    class Table(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.cos = torch.ones(4)

    m = Table().to("meta")  # meta stands in for a GPU: .to() moves parameters and buffers only
    assert m.lin.weight.device.type == "meta" and m.cos.device.type == "cpu"
    lstm = torch.nn.LSTM(4, 4).to("meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        lstm(torch.zeros(3, 2, 4, device="meta"), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))


@pytest.fixture
def word_lm(tmp_path: Path) -> Path:
    shutil.copytree(SCRIPTS / "word_lm", tmp_path / "word_lm")
    return tmp_path / "word_lm"


def test_an_lstm_state_made_in_forward_names_its_line_and_the_trace_goes_on(word_lm: Path) -> None:
    done = _doctor(word_lm, "run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "main.py", "--fresh-hidden", "--accel")
    report = json.loads(done.stdout)
    [finding] = report["findings"]
    zeros = _line(word_lm / "model.py", "hidden = (torch.zeros(")
    assert finding["code"] == "DD201" and finding["module"] == "rnn" and finding["severity"] == "error"
    assert finding["source"] == {"file": "model.py", "line": zeros} and f"torch.zeros at model.py:{zeros}" in finding["message"]
    assert report["coverage"]["phases"]["backward"] is True and report["coverage"]["stopped"] is None  # repaired, the step went on past the LSTM
    fixed = _doctor(word_lm, "fix", "--run", "--simulate", "--gpu", "a100", "--write-patch", "fix.patch", "--",
                    "python", "main.py", "--fresh-hidden", "--accel")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    patch = (word_lm / "fix.patch").read_text()
    assert patch.count("device=input.device") == 2  # h0 and c0, one statement
    subprocess.run(["git", "apply", "fix.patch"], cwd=word_lm, check=True, capture_output=True)
    subprocess.run([sys.executable, "main.py", "--fresh-hidden"], cwd=word_lm, check=True, capture_output=True, timeout=120)


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    root = tmp_path / "llama"
    shutil.copytree(SCRIPTS / "llama_rope", root)
    model = root / "model.py"
    kept = "        self.freqs_cos, self.freqs_sin = self.freqs_cos.to(h.device), self.freqs_sin.to(h.device)\n"
    assert kept in model.read_text()
    model.write_text(model.read_text().replace(kept, ""))  # the bug: llama's move in forward dropped
    return root


def test_rope_tables_kept_as_attributes_name_their_init_line_and_become_buffers(llama: Path) -> None:
    done = _doctor(llama, "run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "train.py")
    findings = json.loads(done.stdout)["findings"]
    init = _line(llama / "model.py", "self.freqs_cos, self.freqs_sin = precompute_freqs_cis")
    assert sorted(f["tensors"][1]["name"] for f in findings) == ["freqs_cos", "freqs_sin"]  # once each, not once a layer
    for f in findings:
        assert f["code"] == "DD201" and f["source"] == {"file": "model.py", "line": init}
        assert "as a buffer" in f["fixes"][0]["description"] and "torch.slice" not in json.dumps(f)
    fixed = _doctor(llama, "fix", "--run", "--simulate", "--gpu", "a100", "--write-patch", "fix.patch", "--", "python", "train.py")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    patch = (llama / "fix.patch").read_text()
    assert 'self.register_buffer("freqs_cos", freqs_cos, persistent=False)' in patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=llama, check=True, capture_output=True)
    subprocess.run([sys.executable, "train.py", "--device", "cpu"], cwd=llama, check=True, capture_output=True, timeout=120)
    state = torch.load(llama / "ckpt.pt")
    assert len(state) == 11 and not any("freqs" in k for k in state)  # non-persistent: the checkpoint is as it was
