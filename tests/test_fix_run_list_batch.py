"""A batch held as a list and moved with a comprehension (minGPT's Trainer: `batch = [t.to(self.device)
for t in batch]`), its move dropped: fix --run moves each element where the script walks the list, with
the script's own device (`self.device`), never `.to` on the list, nor `next(self.parameters())` in a
class that is not a Module (sweep class S3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_codemods import applied, skipped

from dtype_doctor.cli.main import run
from dtype_doctor.fix.codemods import MoveWhereHandled

ROOT = Path(__file__).resolve().parent.parent

# Team-written, in minGPT's mingpt/trainer.py shape: a Trainer with self.device, a DataLoader of
# (x, y) tuples, `next(data_iter)`, the comprehension (its `.to(self.device)` dropped), a save.
TRAINER = '''\
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        x = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(i))
        return x, (x + 1) % 10


class Trainer:
    def __init__(self, model, dataset):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device)
        self.loader = DataLoader(dataset, batch_size=4)

    def run(self, max_iters=3):
        opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        data_iter = iter(self.loader)
        for _ in range(max_iters):
            batch = next(data_iter)
            batch = [t for t in batch]
            x, y = batch
            logits = self.model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 10), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.save(self.model.state_dict(), "model.pt")
        return float(loss)


model = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 10))
print("loss", Trainer(model, Pairs()).run())
'''


def test_a_list_batch_left_on_the_cpu_is_moved_in_its_comprehension(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # On a T4 the plain script dies at the embedding: a CUDA weight and a CPU index (every CUDA op checks its
    # operands' devices: aten/src/ATen/native/TensorIterator / "Expected all tensors to be on the same device");
    # the simulation sees that refusal. This machine has no GPU, so the plain failure is the simulated one.
    monkeypatch.chdir(tmp_path)
    subprocess.run(["git", "init", "-q", "."], check=True)
    (tmp_path / "trainer.py").write_text(TRAINER)
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "trainer.py"])
    report = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 1 and any(f["code"] == "DD201" for f in report["findings"])  # the bug, seen
    with pytest.raises(SystemExit) as exit_info:
        run(["fix", "--run", "--simulate", "--gpu", "t4", "--write-patch", "fix.patch", "-f", "json", "--", "python", "trainer.py"])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert exit_info.value.code == 0 and report["fix"]["verified"] is True, out.err[-2000:]
    assert report["fix"]["script"]["ran_on"].startswith("to its model's next call")  # simulated: stopped there, not its end
    patch = (tmp_path / "fix.patch").read_text()
    added = [line[1:].strip() for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["batch = [t.to(self.device) for t in batch]"]  # the element, the script's own device
    assert (tmp_path / "trainer.py").read_text() == TRAINER and not (tmp_path / "model.pt").exists()  # simulated: untouched
    subprocess.run(["git", "apply", "fix.patch"], check=True)
    plain = subprocess.run([sys.executable, "trainer.py"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "loss" in plain.stdout and (tmp_path / "model.pt").is_file(), plain.stderr[-2000:]


NOT_A_MODULE = '''\
class Trainer:
    def __init__(self, model, args):
        self.model = model.to(DEVICE)

    def step(self, data_iter):
        batch = next(data_iter)
        x = batch[0]
'''


def test_a_trainer_method_moves_to_the_device_the_script_moves_its_model_to() -> None:
    # The Trainer is not an nn.Module: `next(self.parameters())` there is an AttributeError.
    before = NOT_A_MODULE.replace("DEVICE", "self.device")
    assert "        x = batch[0].to(self.device)\n" in applied(MoveWhereHandled(7), before)


def test_no_device_the_method_can_name_is_a_skip_never_self_parameters() -> None:
    before = NOT_A_MODULE.replace("DEVICE", "args.device")  # `args` is __init__'s, not step's
    assert "no `device` in scope" in skipped(MoveWhereHandled(7), before)


def test_a_batch_container_from_next_gets_no_to_without_a_comprehension_to_move_in() -> None:
    before = NOT_A_MODULE.replace("DEVICE", "self.device")
    assert "batch container" in skipped(MoveWhereHandled(6), before)
