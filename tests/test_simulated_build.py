"""Under `run --simulate` the build is a CUDA 12 build for the profile's GPU: libraries that read
`torch.version.cuda`, the arch list, cuDNN's version (transformers' tf32 check, accelerate,
bitsandbytes) get a GPU machine's answers, and the CPU-only build's answers come back afterwards.
`torch.cuda.set_device(k)` selects GPU k, as `current_device()` then says."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch

from helpers_cli import run_json


_run = run_json


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    # A test of op_db in this process imports torch.testing._internal.common_utils, which freezes torch.backends'
    # flags (disable_global_flags): the script here sets them as a script does, so they are thawed for it.
    # transformers' tf32=True sets the process-wide fp32 precision: it is put back after the test.
    with torch.backends.__allow_nonbracketed_mutation():  # noqa: SLF001 - the thaw torch's own flags() uses
        saved = torch.backends.fp32_precision
        try:
            yield tmp_path
        finally:
            torch.backends.fp32_precision = saved


def _forget_transformers_answers() -> None:
    import transformers.utils.import_utils as utils

    utils.is_torch_tf32_available.cache_clear()
    utils.enable_tf32.cache_clear()


TF32 = """\
import torch
from transformers import TrainingArguments

print("build cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "arch", torch.cuda.get_arch_list(),
      "bf16", torch.cuda.is_bf16_supported())
args = TrainingArguments(output_dir="out", tf32=True, report_to=[])
print("tf32 accepted")
model = torch.nn.Linear(8, 4).cuda()
model(torch.randn(2, 8, device="cuda")).sum().backward()
"""


def test_tf32_training_arguments_are_accepted_on_a_simulated_a100(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    from transformers import TrainingArguments

    # Plainly, on this CPU-only build: refused (torch.version.cuda is None).
    _forget_transformers_answers()
    assert torch.version.cuda is None
    with pytest.raises(ValueError, match="tf32"):
        TrainingArguments(output_dir=str(workdir / "plain"), tf32=True, report_to=[])
    (workdir / "train.py").write_text(TF32)
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "train.py"], capsys)
    assert "build cuda 12.8 cudnn 91002 arch ['sm_80'] bf16 True" in err
    assert "tf32 accepted" in err and code == 0 and report["target"]["gpu"].startswith("a100")
    # The CPU-only build's answers are back after the simulation.
    assert torch.version.cuda is None and torch.backends.cudnn.version() is None and torch.cuda.get_arch_list() == []
    import transformers.utils.import_utils as utils

    assert utils.is_torch_tf32_available() is False


def test_tf32_is_refused_on_a_simulated_t4_as_on_a_real_one(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # transformers/utils/import_utils.py is_torch_tf32_available:
    #     if torch.cuda.get_device_properties(torch.cuda.current_device()).major < 8: return False
    # and training_args.py then raises "--tf32 requires Ampere or a newer GPU arch". A T4 is sm_75.
    _forget_transformers_answers()
    (workdir / "train.py").write_text(TF32)
    code, _report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "train.py"], capsys)
    assert "build cuda 12.8 cudnn 91002 arch ['sm_75']" in err
    assert "tf32 accepted" not in err and "requires Ampere" in err and code == 2
    assert torch.version.cuda is None


SET_DEVICE = """\
import torch

print("before", torch.cuda.current_device(), torch.accelerator.current_device_index())
torch.cuda.set_device(1)
x = torch.randn(2, 8, device="cuda")
print("after", torch.cuda.current_device(), torch.accelerator.current_device_index(), "x on", x.device)
with torch.cuda.device(0):
    print("inside", torch.cuda.current_device())
print("outside", torch.cuda.current_device())
try:
    torch.cuda.set_device(5)
except RuntimeError as exc:
    print("refused", type(exc).__name__)
model = torch.nn.Linear(8, 4).cuda()
model(x).sum().backward()
"""


def test_set_device_selects_the_gpu_current_device_names(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(SET_DEVICE)
    code, _report, err = _run(["run", "--simulate", "--gpu", "a100", "--gpus", "2", "-f", "json", "--", "python", "train.py"], capsys)
    assert "before 0 0" in err
    # A CUDA machine's "cuda" is its current device: after set_device(1), cuda:1.
    assert "after 1 1 x on cuda:1" in err
    assert "inside 0" in err and "outside 1" in err
    assert "refused" in err  # two GPUs: there is no cuda:5 (a real one raises "invalid device ordinal")
    assert code == 0


# diffusers examples/discrete_diffusion/train_llada2.py's shape: a generator made on the batch's device.
GENERATOR = """\
import torch

model = torch.nn.Linear(8, 4).cuda()
x = torch.randn(2, 8).cuda()
g = torch.Generator(device=x.device).manual_seed(0)
noise = torch.randn(x.shape, generator=g, device=x.device)
state = g.get_state()
print("generator on", g.device, "noise on", noise.device, "seed", g.initial_seed(), "is a Generator", isinstance(g, torch.Generator))
print("cpu generator", isinstance(torch.Generator(), torch.Generator), torch.Generator().device)
model(x + noise).sum().backward()
"""


def test_a_cuda_generator_is_made_on_the_simulated_gpu(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # Plainly, on this CPU-only build, a CUDA generator cannot be made ("Cannot get CUDA generator without ATen_cuda").
    with pytest.raises(RuntimeError):
        torch.Generator(device="cuda")
    (workdir / "train.py").write_text(GENERATOR)
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "train.py"], capsys)
    assert "generator on cuda:0 noise on cuda:0 seed 0 is a Generator True" in err
    assert "cpu generator True cpu" in err
    assert code == 0 and report["target"]["device"] == "cuda:0"
    assert torch.Generator is torch._C.Generator  # torch's own after the simulation


# train_llada2.py's checkpoint: save_pretrained of a model on the (simulated) GPU.
SAVE = """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, tie_word_embeddings=False)
model = LlamaForCausalLM(config).cuda()
ids = torch.randint(0, 64, (2, 8), device="cuda")
model(ids, labels=ids).loss.backward()
model.save_pretrained("ckpt")
print("saved")
"""


def test_save_pretrained_of_a_simulated_model_does_not_see_every_weight_as_shared(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    from safetensors.torch import storage_ptr

    # The cause: tensors without data have no address; two distinct ones read as one storage.
    a, b = torch.empty(4, 4, device="meta"), torch.empty(4, 4, device="meta")
    assert storage_ptr(a) == storage_ptr(b) == 0
    (workdir / "train.py").write_text(SAVE)
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "train.py"], capsys)
    assert "saved" in err and code == 0 and "DD001" not in [f["code"] for f in report["findings"]]
    assert not (workdir / "ckpt").exists()  # a simulated run never writes the user's files
    assert storage_ptr(a) == 0  # safetensors' own after the simulation
