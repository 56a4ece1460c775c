"""`run --simulate --gpus N` over a script that loads with `from_pretrained(..., device_map="auto")`: the
script sees N GPUs, accelerate places the model over them, and a tensor the script makes on cuda:0
meeting a layer on another GPU (a steering vector added by a forward hook) is found where it meets it.
The clean control, the same model over 4 GPUs without the hook, is tests/test_device_map.py's
test_a_script_loading_with_device_map_auto_sees_the_gpus (no DD201)."""

import textwrap
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from dtype_doctor.run.runner import RunOptions, run_script
from helpers_models import FIXTURE_MODELS, found

SCRIPT = textwrap.dedent("""
    import sys, torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], device_map="auto",
                                                 max_memory={i: "100KiB" for i in range(torch.cuda.device_count())})
    if sys.argv[2] == "steer":
        steer = torch.ones(model.config.hidden_size, device="cuda:0")  # made on the first GPU
        model.model.layers[-1].register_forward_hook(lambda m, i, o: o * steer)
    ids = torch.randint(5, 100, (2, 8)).to(model.device)
    model(input_ids=ids, labels=ids).loss.backward()
""")


def test_cuda_refuses_a_mul_across_two_gpus():
    """The oracle: PyTorch's own device propagation (fake tensors on meta:k, as the simulation places cuda:k)."""
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.empty(2, 8, 32, device="meta:2") * torch.empty(32, device="meta:0")


def test_a_hook_adding_a_cuda0_tensor_on_another_gpu_is_found(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_script(["python", str(tmp_path / "train.py"), str(FIXTURE_MODELS / "llama-tiny"), "steer"],
                        options=RunOptions(simulate=True, gpus=4))
    plan = result.report.target.devices
    assert plan.strategy == "script" and plan.gpus == 4
    last = dict(plan.device_map).get("model.layers.1", dict(plan.device_map).get("model.layers"))
    mismatches = found(result.report, "DD201")
    assert last != "cuda:0"
    first = mismatches[0]
    assert first.module == "model.layers.1" and {t.device for t in first.tensors} == {"cuda:0", last}
    assert "found at least two devices" in first.pytorch_error


PLAIN = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(8, 2).to("cuda:0")
    x = torch.randn(4, 8, device="cuda:1").to("cuda:0")
    model(x).sum().backward()
    print("ran on", model.weight.device, x.device)
""")


def test_a_plain_module_moved_to_cuda0_runs_on_two_gpus(tmp_path):
    """`--gpus 2` and `nn.Linear(8, 2).to("cuda:0")`: the move a single GPU takes, taken on either of two."""
    (tmp_path / "train.py").write_text(PLAIN)
    result = run_script(["python", str(tmp_path / "train.py")], options=RunOptions(simulate=True, gpus=2))
    assert result.outcome.error is None and not result.report.findings
    assert result.report.trace.coverage.complete


@pytest.mark.parametrize("mode", ["moved", "left"])
def test_a_device_map_model_with_the_scripts_own_head_on_cuda0(mode):
    """The model dispatched by accelerate onto cuda:1, the script's head on cuda:0: with the hidden
    state moved to the head it is clean; left on cuda:1, the head's matmul meets two devices (the
    oracle above), found in the head, named as the script names it."""
    script = Path(__file__).resolve().parent / "scripts" / "device_map_head.py"
    result = run_script(["python", str(script), str(FIXTURE_MODELS / "llama-tiny"), mode], options=RunOptions(simulate=True, gpus=2))
    report = result.report
    assert report.trace.coverage.complete and report.target.device == "cuda:1"
    if mode == "moved":
        assert not report.findings
        return
    first = found(report, "DD201")[0]
    assert first.module == "head" and {t.device for t in first.tensors} == {"cuda:0", "cuda:1"}
    assert "found at least two devices" in first.pytorch_error and "meta" not in first.pytorch_error
