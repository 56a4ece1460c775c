"""DD116 recompute-dtype-differs: activation checkpointing's recompute under another precision policy
than its forward. The plain script first: non-reentrant checkpoint raises CheckpointError in the
backward (torch/utils/checkpoint.py, check_recomputed_tensors_match), on this CPU too; then `run`
names the checkpointed region, the first function whose output differs and the autocast each ran
under, real and simulated; a clean checkpointed step (the autocast around the call, as checkpoint
expects; transformers' gradient_checkpointing_enable) has no finding and no false DD001."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.run.runner import RunOptions, run_script

ROOT = Path(__file__).resolve().parents[1]

# The script's own mixed-precision policy: a flag the block reads to enter autocast, set around the
# forward only. checkpoint restores the autocast active at its call, not the flag: the recompute
# in the backward runs float32 where the forward ran bfloat16.
SCRIPT = """\
import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.amp = False

    def forward(self, x):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled={enabled}):
            return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = checkpoint(self.block, x, use_reentrant=False)
        return self.head(h.float())


@contextlib.contextmanager
def mixed_precision(model):
    model.block.amp = True
    try:
        yield
    finally:
        model.block.amp = False


model = Net().to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    with mixed_precision(model):
        loss = model(torch.randn(4, 8, device=DEVICE)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)

    def write(enabled: str) -> Path:
        path = tmp_path / "train.py"
        path.write_text(SCRIPT.format(enabled=enabled))
        return path
    return write


def test_the_plain_script_raises_checkpoint_error_and_run_names_the_policy(script) -> None:
    path = script("self.amp")
    plain = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=path.parent)
    assert plain.returncode == 1 and "CheckpointError" in plain.stderr

    result = run_script(["python", "train.py"])
    (f,) = result.report.findings
    assert f.code == "DD116" and f.severity == "error" and f.op == "linear" and f.module_type == "Block"
    assert (f.source.file, f.source.line) == ("train.py", 28)  # the checkpoint(...) call
    assert "bfloat16[4, 8] cpu" in f.message and "float32[4, 8] cpu" in f.message
    assert "under autocast(cpu, bfloat16)" in f.message and "the recompute outside autocast" in f.message
    assert f.pytorch_error.startswith("CheckpointError")
    (diff,) = result.report.trace.recompute.diffs
    assert diff.policy_differs and (diff.forward_autocast, diff.recompute_autocast) == ("cpu:bfloat16", None)
    assert result.report.to_dict()["recompute"]["regions"] == 1


def test_the_same_region_under_one_policy_is_clean_and_not_a_failed_forward(script) -> None:
    path = script("True")
    assert subprocess.run([sys.executable, str(path)], capture_output=True, timeout=120, cwd=path.parent).returncode == 0
    result = run_script(["python", "train.py"])
    assert result.report.findings == ()  # checkpoint's early stop (_StopRecomputationError) is not a failure (was DD001)
    facts = result.report.trace.recompute
    assert (facts.regions, facts.recomputed, facts.diffs) == (1, 1, ())
    assert "optimizer" in result.report.trace.coverage.phases


def test_simulated_cuda_names_the_same_difference_on_cuda(script) -> None:
    script("self.amp")
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, gpu="a100", device="cuda"))
    (f,) = result.report.findings
    assert f.code == "DD116" and "under autocast(cuda, bfloat16)" in f.message
    assert "bfloat16[4, 8] cuda:0" in f.message and " meta" not in f.message
    assert "device(type='cuda', index=0)" in f.pytorch_error and "type='meta'" not in f.pytorch_error


def test_transformers_gradient_checkpointing_under_autocast_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(f"""\
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained({str(ROOT / 'fixtures/models/llama-tiny')!r}, dtype=torch.float32)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 100, (2, 8))
for step in range(2):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
""")
    result = run_script(["python", "train.py"])
    assert [f.code for f in result.report.findings if f.severity != "info"] == []
    facts = result.report.trace.recompute
    assert facts.regions == facts.recomputed == 2 and facts.diffs == ()  # llama-tiny's two decoder layers


def test_a_simulated_recompute_reenters_the_cuda_autocast_of_its_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trl's SFT shape: autocast around the call, the loss chunk checkpointed inside it. checkpoint re-enters
    the autocast of the device type of the function's tensors (torch/utils/checkpoint.py, _infer_device_type
    and recompute_fn's torch.amp.autocast(device_type=...)): a simulated CUDA tensor's is cuda, so the
    recompute runs in bfloat16 as on the GPU (it read `meta`, ran in float32: a false DD116 on trl)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("""\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

device = "cuda" if torch.cuda.is_available() else "cpu"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(checkpoint(self.body, x, use_reentrant=False))


model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = model(torch.randn(4, 8, device=device)).float().sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
""")
    assert subprocess.run([sys.executable, "train.py"], capture_output=True, timeout=120).returncode == 0
    for options in (None, RunOptions(simulate=True, gpu="a100", device="cuda")):
        result = run_script(["python", "train.py"], options=options)
        assert result.report.findings == ()
        facts = result.report.trace.recompute
        assert (facts.regions, facts.recomputed, facts.diffs) == (1, 1, ())


def test_the_whole_model_checkpointed_is_not_a_failed_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint(model, x) at the script's top level: the recompute calls the model itself and stops early
    (checkpoint's _StopRecomputationError, caught by checkpoint): not a failure of the step (was a false DD001)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("""\
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = checkpoint(model, torch.randn(4, 8), use_reentrant=False).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
""")
    assert subprocess.run([sys.executable, "train.py"], capture_output=True, timeout=120).returncode == 0
    result = run_script(["python", "train.py"])
    assert result.report.findings == () and "optimizer" in result.report.trace.coverage.phases
