"""DD604 fsdp1-flatten-dtypes, against FSDP1's own wrapping (use_orig_params=False) on the fake process group."""

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

import dtype_doctor

bnb = pytest.importorskip("bitsandbytes")


def qlora(storage: torch.dtype) -> nn.Module:
    """A frozen 4-bit layer (quantized on the CPU as bitsandbytes does on .to()) and a frozen bf16 head."""
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_storage=storage, quant_type="nf4").to("cpu")
    model = nn.Sequential(layer, nn.Linear(64, 4).to(torch.bfloat16))
    return model.requires_grad_(False)


def wrap(model: nn.Module) -> None:
    FSDP(model, use_orig_params=False, device_id=torch.device("cpu"))


def dd604(model: nn.Module, x: torch.Tensor):
    return [f for f in dtype_doctor.diagnose(model, {"input": x}, fsdp1=True).findings if f.code == "DD604"]


@pytest.mark.parametrize("storage,raised", [(torch.uint8, "Cannot flatten integer dtype tensors"), (torch.bfloat16, None)])
def test_qlora_weights_flatten_only_with_a_floating_quant_storage(storage, raised):
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with dtype_doctor.fake_world(2):
        found = dd604(qlora(storage), x)
        if raised:
            with pytest.raises(ValueError, match=raised):
                wrap(qlora(storage))
            [f] = found
            assert raised in f.pytorch_error and "bnb_4bit_quant_storage" in f.fixes[0].description
        else:
            wrap(qlora(storage))  # FSDP1 flattens it
            assert not found


def test_a_float32_head_beside_bf16_weights():
    model = nn.Sequential(nn.Linear(16, 16).to(torch.bfloat16), nn.Linear(16, 4))
    with dtype_doctor.fake_world(2):
        with pytest.raises(ValueError, match="Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"):
            wrap(nn.Sequential(nn.Linear(16, 16).to(torch.bfloat16), nn.Linear(16, 4)))
        [f] = dd604(model, torch.randn(2, 16, dtype=torch.bfloat16))
    assert f.pytorch_error == "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32"
    assert f.remedies[0].strategy == "half-model" and f.remedies[0].to == "bfloat16"
