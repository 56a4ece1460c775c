"""--gpus/--device-map: a model spread by accelerate over simulated GPUs, and what breaks where
tensors meet across them (DD201 with CUDA's own words), against PyTorch's device propagation."""

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import dtype_doctor
from dtype_doctor.records.errors import InputError, UsageError
from helpers_models import found

# Eight blocks of 16x16 fp32 weights (1 KiB each) over eight GPUs of 1.5 KB: one block per GPU.
EIGHT_GPUS = {k: 1500 for k in range(8)}


class Block(nn.Module):
    def __init__(self, arange_on_cuda: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16, bias=False)
        self.arange_on_cuda = arange_on_cuda

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.arange_on_cuda:  # created in forward on the default GPU, whatever GPU the block is on
            x = x + torch.arange(16, device="cuda", dtype=x.dtype)
        return self.lin(x)


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self, loss_inside: bool = False, arange_block: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(i == arange_block) for i in range(7))
        self.head = nn.Linear(16, 4, bias=False)
        self.loss_inside = loss_inside

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        if self.loss_inside and labels is not None:
            return F.cross_entropy(logits, labels)  # labels stay where the root hook put them: cuda:0
        return logits


def batch():
    return {"x": torch.randn(3, 16), "labels": torch.tensor([0, 1, 2])}


def test_fake_tensors_on_two_gpus_fail_as_cuda_does():
    """The oracle: PyTorch's own fake-tensor device propagation refuses operands from two devices."""
    with FakeTensorMode():
        a, b = torch.empty(2, 16, device="meta:7"), torch.empty(2, dtype=torch.long, device="meta:0")
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two devices"):
            F.cross_entropy(a, b)


def test_eight_gpu_map_finds_labels_against_logits_on_another_gpu():
    report = dtype_doctor.diagnose(Net(loss_inside=True), batch(), simulate=True, gpus=8, max_memory=EIGHT_GPUS)
    plan = report.target.devices
    assert plan is not None and plan.gpus == 8
    placed = dict(plan.device_map)
    # accelerate keeps room for the largest block on the first GPU: the blocks start on cuda:1,
    # which is then the main device its root hook sends the inputs (labels too) to.
    assert placed["head"] == "cuda:7" and placed["blocks.0"] == "cuda:1"
    [f] = found(report, "DD201")
    assert {t.device for t in f.tensors} == {"cuda:1", "cuda:7"}
    assert "found at least two devices, cuda:7 and cuda:1!" in f.pytorch_error
    assert "runs on cuda:7" in f.message


def test_a_tensor_created_in_forward_on_cuda0_meets_a_block_on_another_gpu():
    report = dtype_doctor.diagnose(Net(arange_block=3), {"x": torch.randn(3, 16)}, simulate=True, gpus=8, max_memory=EIGHT_GPUS)
    block = dict(report.target.devices.device_map)["blocks.3"]
    [f] = found(report, "DD201")
    assert block != "cuda:0" and f.module == "blocks.3" and {t.device for t in f.tensors} == {"cuda:0", block}


def test_a_clean_map_stays_clean_and_is_reported():
    report = dtype_doctor.diagnose(Net(), {"x": torch.randn(3, 16)}, simulate=True, gpus=8, max_memory=EIGHT_GPUS, train=True)
    assert not [f for f in report.findings if f.severity == "error"]
    d = report.to_dict()["target"]
    assert [x["device"] for x in d["devices"]] == [f"cuda:{k}" for k in range(8)]
    assert all(x["weights"] <= x["capacity"] for x in d["devices"])
    assert d["device_map"]["strategy"] == "auto" and d["device"] == "cuda:0"


def test_tied_weights_split_over_two_gpus_by_a_map_file(tmp_path):
    """A FILE.json that puts a tied head on another GPU than its embedding: the weight stays with the
    embedding, accelerate's hook sends the head's input to the head's GPU, and the two meet there."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 16)
            self.head = nn.Linear(16, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    path = tmp_path / "map.json"
    path.write_text(json.dumps({"embed": 0, "head": "cuda:1"}))
    report = dtype_doctor.diagnose(Tied(), {"ids": torch.tensor([[1, 2]])}, simulate=True, gpus=2, device_map=str(path))
    assert report.target.devices.strategy == "file"
    assert found(report, "DD201")


def test_offloaded_layers_are_named_and_the_user_model_is_untouched():
    model = Net()
    before = {n: p.device for n, p in model.named_parameters()}
    report = dtype_doctor.diagnose(model, {"x": torch.randn(3, 16)}, simulate=True, gpus=2,
                                   max_memory={0: 1500, 1: 1500, "cpu": "1GB"})
    assert not found(report, "DD201")
    offloaded = report.target.devices.offloaded
    assert offloaded and all(d == "cpu" for _, d in offloaded)
    assert {n: p.device for n, p in model.named_parameters()} == before and not hasattr(model.blocks[0], "_hf_hook")


def test_bad_device_map_options_are_usage_errors():
    with pytest.raises(UsageError, match="add --simulate"):
        dtype_doctor.diagnose(Net(), {"x": torch.randn(3, 16)}, gpus=2)
    with pytest.raises(UsageError, match="--device-map must be"):
        dtype_doctor.diagnose(Net(), {"x": torch.randn(3, 16)}, simulate=True, device_map="everywhere")
    with pytest.raises(UsageError, match="--max-memory takes"):
        dtype_doctor.diagnose(Net(), {"x": torch.randn(3, 16)}, simulate=True, gpus=2, max_memory="0=lots")
    with pytest.raises(InputError, match="GPU 3"):
        dtype_doctor.diagnose(Net(), {"x": torch.randn(3, 16)}, simulate=True, gpus=2, device_map={"": 3})


def test_a_script_loading_with_device_map_auto_sees_the_gpus(tmp_path):
    from dtype_doctor.run.runner import RunOptions, run_script
    from helpers_models import FIXTURE_MODELS

    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "assert torch.cuda.device_count() == 4\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map='auto', max_memory={i: '100KiB' for i in range(4)})\n"
        "ids = torch.randint(5, 100, (2, 8)).to(model.device)\n"
        "model(input_ids=ids, labels=ids).loss.backward()\n"
    )
    result = run_script(["python", str(script), str(FIXTURE_MODELS / "llama-tiny")], options=RunOptions(simulate=True, gpus=4))
    assert result.outcome.error is None
    plan = result.report.target.devices
    assert plan.strategy == "script" and len({d for _, d in plan.device_map}) > 1
    assert not found(result.report, "DD201")
