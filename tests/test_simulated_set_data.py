"""`param.data = t` across the CPU and the simulated GPU under `run --simulate`, as on a GPU.

torch's `.data` setter (`VariableHooks::set_data`, torch/csrc/autograd/variable.cpp) refuses two
tensors whose types are incompatible (`_has_compatible_shallow_copy_type`), and CPU and CUDA tensors
are compatible: both dense (c10/core/TensorImpl.h, `has_compatible_shallow_copy_type`: "CPU is
compatible with CUDA"). So on a GPU a CPU parameter takes a CUDA tensor (peft's OLoRA init,
bitsandbytes' 8-bit quantize on load, `Module._apply` moving a 4-bit weight) and stays the same
object; a simulated CUDA tensor lives on `meta`, which is not dense, and this machine refuses it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers_cli import run_json
from helpers_models import FIXTURE_MODELS


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _simulated(workdir: Path, text: str, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict, str]:
    (workdir / "train.py").write_text(text)
    return run_json(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "train.py", *args], capsys)


def _errors(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"] if f["severity"] == "error"]


def test_set_data_takes_a_compatible_tensor_and_refuses_meta_here() -> None:
    """The plain calls: between two CPU tensors `.data =` keeps the parameter and gives it the new
    tensor; a meta tensor (the simulated GPU's home) is refused on this machine, where CUDA is not."""
    param = torch.nn.Parameter(torch.ones(2, 3))
    same = param
    param.data = torch.zeros(4, dtype=torch.float64)
    assert param is same and param.shape == (4,) and param.dtype == torch.float64 and param.requires_grad
    with pytest.raises(RuntimeError):
        param.data = torch.zeros(4, device="meta")


SET_DATA = """\
import torch
lin = torch.nn.Linear(4, 4, bias=False)
weight = lin.weight
lin.weight.data = torch.zeros(4, 4, device="cuda")
print("same", lin.weight is weight, type(lin.weight).__name__, lin.weight.device, lin.weight.requires_grad)
print(lin(torch.ones(1, 4, device="cuda")).sum())
"""


def test_a_cpu_parameter_takes_a_cuda_tensor_as_on_a_gpu(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, report, err = _simulated(workdir, SET_DATA, capsys)
    assert code == 0, err
    assert "same True Parameter cuda:0 True" in err
    assert report["findings"] == [] and report["coverage"]["complete"]


HOST_DATA = """\
import torch
lin = torch.nn.Linear(4, 4, bias={bias}).to("cuda")
lin.weight.data = torch.zeros(4, 4)  # a host tensor: on a GPU the weight is on the CPU now
print("weight on", lin.weight.device)
lin(torch.ones(1, 4, device="cuda"))  # a CUDA input meets the CPU weight: "Expected all tensors to be on the same device"
"""


@pytest.mark.parametrize("bias", [True, False])  # addmm, and mm, whose meta kernels check no devices
def test_a_cuda_parameter_given_a_host_tensor_is_still_a_device_mismatch(bias: bool, workdir: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """The same setter takes a CPU tensor on a CUDA parameter on a GPU (CPU and CUDA both dense): the
    weight is on the CPU, and the CUDA input meets it in the forward, where CUDA refuses two devices."""
    code, report, err = _simulated(workdir, HOST_DATA.format(bias=bias), capsys)
    assert "weight on cpu" in err
    assert code == 1 and "DD201" in _errors(report)


BNB_MOVES = """\
import sys
import torch
import bitsandbytes as bnb
if sys.argv[1] == "4bit":  # quantized on the CPU first, then moved: Module._apply sets the weight's .data
    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float16).to("cpu")
else:  # quantized as it moves: Int8Params._quantize sets its own .data to the int8 tensor
    layer = bnb.nn.Linear8bitLt(64, 64, bias=False, has_fp16_weights=False)
model = torch.nn.Sequential(layer)
weight = layer.weight
model.to("cuda")
print("moved", layer.weight is weight, type(layer.weight).__name__, layer.weight.device, layer.weight.dtype)
print(model(torch.ones(2, 64, device="cuda", dtype=torch.float16)).dtype)
"""


@pytest.mark.parametrize(("kind", "moved"), [("4bit", "Params4bit cuda:0 torch.uint8"), ("8bit", "Int8Params cuda:0 torch.int8")])
def test_a_quantized_layer_moves_to_the_gpu_keeping_its_weight(kind: str, moved: str, workdir: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("bitsandbytes")
    code, report, err = _simulated(workdir, BNB_MOVES, capsys, kind)
    assert code == 0, err
    assert f"moved True {moved}" in err and _errors(report) == []


INT8_LOAD = """\
import sys
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                             device_map={"": 0})
weight = model.model.layers[0].self_attn.q_proj.weight
print("loaded", type(weight).__name__, weight.dtype, weight.device)
model(input_ids=torch.randint(5, 600, (2, 8), device="cuda"))  # LLM.int8: outlier columns past the threshold
"""


def test_an_8bit_load_onto_the_gpu_quantizes_as_on_a_gpu(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """transformers' Bnb8bitQuantize builds each Int8Params on the CPU and moves it to the GPU, which
    quantizes it in place (`self.data = CB`): the load used to fail with set_data's refusal. The forward's
    outlier count depends on the values (its fake implementation asks a dynamic size): every column is taken,
    stated as a stand-in, and the step is traced whole."""
    pytest.importorskip("bitsandbytes")
    code, report, err = _simulated(workdir, INT8_LOAD, capsys, str(FIXTURE_MODELS / "llama-tiny"))
    assert "loaded Int8Params torch.int8 cuda:0" in err, err
    assert code == 0 and _errors(report) == [] and report["coverage"]["complete"]
    assert "bitsandbytes::int8_vectorwise_quant (its outlier columns)" in {s["what"] for s in report["stand_ins"]}
