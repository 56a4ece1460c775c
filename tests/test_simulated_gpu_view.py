"""`run --simulate`: the script's view of the machine is a GPU's everywhere it looks — the device it
picks with torch.accelerator, the rng state a checkpoint saves, an integer device index for a model,
and where its tensors (the model's outputs included) live after the forward.

Each script is run first as it is on this CPU-only machine (the path it takes without a GPU), then
simulated, where it must take the path it takes on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers_cli import run_json


_run = run_json


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _errors(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"] if f["severity"] == "error"]


# pytorch/examples' way (mnist/main.py, word_language_model/main.py at 77f55b9): the device is the
# accelerator's. The targets stay where the dataset made them: on a GPU, cross_entropy refuses them.
ACCELERATOR_LOOP = """\
import torch

use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
if use_accel:
    print("device", device, torch.accelerator.device_count(), torch.accelerator.current_device_index())
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
data, target = torch.randn(4, 8), torch.randint(0, 3, (4,))
for step in range(2):
    optimizer.zero_grad()
    output = model(data.to(device))
    loss = torch.nn.functional.cross_entropy(output, target)  # target never moved
    loss.backward()
    optimizer.step()
    if use_accel:
        torch.accelerator.synchronize()
        print("allocated", torch.accelerator.memory_allocated() > 0)
"""


def test_a_script_that_picks_its_device_with_torch_accelerator_takes_the_gpu_path(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "main.py").write_text(ACCELERATOR_LOOP)
    code, report, err = _run(["run", "-f", "json", "--", "python", "main.py"], capsys)
    assert code == 0 and "device" not in err and _errors(report) == []  # no accelerator here: all on the CPU, clean
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "main.py"], capsys)
    assert "device cuda 1 0" in err and "allocated True" in err
    assert report["target"]["device"] == "cuda:0" and code == 1 and _errors(report) == ["DD201"]
    assert {t["device"] for t in report["findings"][0]["tensors"]} == {"cpu", "cuda:0"}


# transformers' Trainer._save_rng_state: torch.cuda.random.get_rng_state_all() beside the CPU's; resuming
# sets them back. The same functions as torch.cuda.get_rng_state*, under their own module.
CHECKPOINT_RNG = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 2).to(device)
model(torch.randn(2, 8, device=device)).sum().backward()
states = {"cpu": torch.random.get_rng_state()}
if torch.cuda.is_available():
    torch.cuda.random.manual_seed_all(5)
    states["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.cuda.random.set_rng_state_all(states["cuda"])
    torch.cuda.random.set_rng_state(torch.cuda.random.get_rng_state())
torch.save(states, "rng_state.pth")
print("saved", sorted(states), [tuple(s.shape) for s in states.get("cuda", [])])
"""


def test_the_checkpoint_rng_state_is_the_gpus(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "save.py").write_text(CHECKPOINT_RNG)
    code, _, err = _run(["run", "-f", "json", "--", "python", "save.py"], capsys)
    assert code == 0 and "saved ['cpu'] []" in err
    (workdir / "rng_state.pth").unlink()
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "save.py"], capsys)
    assert code == 0 and "saved ['cpu', 'cuda'] [(16,)]" in err  # one GPU, CUDA's 16-byte philox state
    assert not (workdir / "rng_state.pth").exists()  # a simulated run never writes the user's files
    assert "not_simulated" not in report["coverage"]


# Model cards: `model.to(0)`, `model.cuda(0)`, `.to(device=0)`. Module.to hands its arguments to
# torch._C._nn._parse_to (torch/nn/modules/module.py, Module.to), where a bare index is the current
# accelerator's device: cuda:0 on a CUDA machine. This CPU-only build has no accelerator and refuses it.
MODEL_CARD = """\
import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
model[0].to(0)
model[1].cuda(0)
model.to(device=0)
inputs = torch.randn(2, 8).to(0)
out = model(inputs)
print("on", {p.device.type for p in model.parameters()}, out.device)
"""


def test_an_integer_device_is_a_cuda_index_for_modules_as_for_tensors(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(RuntimeError):
        torch.nn.Linear(2, 2).to(0)  # the plain call on this machine: no accelerator to index
    (workdir / "card.py").write_text(MODEL_CARD)
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "card.py"], capsys)
    assert code == 0 and "on {'cuda'} cuda:0" in err and _errors(report) == []


# After the model's forward the script goes on with its tensors: it moves labels to the logits' device,
# branches on is_cuda, and checks the legacy type name — in the second step as in the first.
AFTER_THE_FORWARD = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).to(device)
x = torch.randn(2, 8).to(device)
labels = torch.tensor([0, 2])
for step in range(2):
    logits = model(x)
    labels = labels.to(logits.device)
    print("step", step, "x", x.device, x.is_cuda, "logits", logits.device, logits.is_cuda, logits.type(), logits.get_device())
    if logits.is_cuda:
        print("gpu path")
    loss = torch.nn.functional.cross_entropy(logits, labels)
    print("loss on", loss.device, "labels on", labels.device)
    loss.backward()
"""


def test_tensors_read_as_cuda_after_the_forward_and_the_outputs_too(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "after.py").write_text(AFTER_THE_FORWARD)
    code, _, err = _run(["run", "-f", "json", "--", "python", "after.py"], capsys)
    assert code == 0 and "gpu path" not in err and "logits cpu False torch.FloatTensor -1" in err
    code, report, err = _run(["run", "--simulate", "--gpu", "h100", "--steps", "2", "-f", "json", "--", "python", "after.py"], capsys)
    assert "step 0 x cuda:0 True logits cuda:0 True torch.cuda.FloatTensor 0" in err
    assert "step 1 x cuda:0 True logits cuda:0 True torch.cuda.FloatTensor 0" in err
    assert err.count("gpu path") == 2 and "loss on cuda:0 labels on cuda:0" in err
    assert code == 0 and _errors(report) == []


# A model card's generation: transformers' greedy loop ends when `unfinished_sequences.max() == 0`, after
# its stopping criteria (`torch.full((batch,), cur_len >= max_length)`, or'ed with the EOS check) say so.
# On tensors without data the loop must still end at its length limit, as it does where no EOS is met;
# before, the EOS check's unknown value kept it going until the script's time limit.
GENERATE = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
model.to(0 if torch.cuda.is_available() else "cpu")
ids = torch.randint(3, 64, (1, 5)).to(model.device)
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=2)
print("generated", tuple(out.shape), out.device)
"""


def test_a_generation_loop_ends_at_its_length_limit(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "gen.py").write_text(GENERATE)
    code, _, err = _run(["run", "--steps", "8", "-f", "json", "--", "python", "gen.py"], capsys)
    assert code == 0 and "generated (1, 9) cpu" in err  # 4 new tokens (no EOS met by this seed's greedy path)
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "--steps", "8", "-f", "json", "--", "python", "gen.py"], capsys)
    assert code == 0 and "generated (1, 9) cuda:0" in err and report["coverage"]["steps"] == 4


# pytorch/examples mnist_hogwild (77f55b9): the model is moved, then shared with the training processes.
SHARED_MODEL = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 2).to(device)
model.share_memory()
print("shared", all(p.is_shared() for p in model.parameters()))
model(torch.randn(2, 8, device=device)).sum().backward()
"""


def test_a_model_shared_after_its_move_to_cuda_shares_as_there(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """torch/_tensor.py: share_memory_ "is a no-op ... for CUDA tensors" and is_shared is "always True for CUDA
    tensors"; a meta stand-in's storage has no file descriptor (`_share_fd_: only available on CPU`)."""
    (workdir / "main.py").write_text(SHARED_MODEL)
    code, report, err = _run(["run", "-f", "json", "--", "python", "main.py"], capsys)  # plainly on this CPU: shared
    assert code == 0 and "shared True" in err
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "main.py"], capsys)
    assert code == 0 and "shared True" in err and _errors(report) == [] and report["target"]["device"] == "cuda:0"
