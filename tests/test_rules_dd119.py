"""DD119 ssm-state-cache-dtype: a conv/SSM state cache written with a state of another dtype. First
the plain behaviour: index_put into a bfloat16 cache from a float16 model raises (sglang#30178's
error; DD101 names it), copy_ converts silently and rounds the state; then the silent write is
named, and a cache in the model's dtype (a mixer of our own, transformers' Mamba) is not."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import dtype_doctor


class Mixer(nn.Module):
    """A mixer that keeps its conv state in a buffer, as serving code preallocates one."""

    def __init__(self, state_dtype: torch.dtype, indexed: bool) -> None:
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(8, 4))
        self.conv = nn.Conv1d(8, 8, 4, groups=8, padding=3)
        self.register_buffer("conv_state", torch.zeros(2, 8, 4, dtype=state_dtype), persistent=False)
        self.indexed = indexed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.indexed:
            self.conv_state[torch.arange(x.shape[0])] = x[:, :, -4:]
        else:
            self.conv_state.copy_(x[:, :, -4:])
        return self.conv(x)[..., : x.shape[-1]]


class Model(nn.Module):
    def __init__(self, dtype: torch.dtype, state_dtype: torch.dtype, indexed: bool = False) -> None:
        super().__init__()
        self.mixer = Mixer(state_dtype, indexed)
        self.to(dtype)
        self.mixer.conv_state = self.mixer.conv_state.to(state_dtype)


X = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(0))


def codes(model: nn.Module, x: torch.Tensor) -> list[str]:
    return [f.code for f in dtype_doctor.diagnose(model.mixer, {"x": x}).findings if f.code in ("DD101", "DD119")]


def test_index_put_into_another_dtype_raises_and_is_dd101s() -> None:
    model = Model(torch.float16, torch.bfloat16, indexed=True)
    with pytest.raises(RuntimeError):
        model.mixer(X.half())
    assert codes(model, X.half()) == ["DD101"]


def test_copy_into_a_bf16_cache_rounds_silently_and_is_named() -> None:
    model = Model(torch.float32, torch.bfloat16)
    model.mixer(X)  # no error
    assert not torch.equal(model.mixer.conv_state.float(), X[:, :, -4:])
    [f] = [f for f in dtype_doctor.diagnose(model.mixer, {"x": X}).findings if f.code == "DD119"]
    assert f.severity == "warning" and "conv_state" in f.message and "bfloat16" in f.message


@pytest.mark.parametrize("dtype, state", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)])
def test_not_when_the_cache_holds_the_state_exactly(dtype: torch.dtype, state: torch.dtype) -> None:
    assert codes(Model(dtype, state), X.to(dtype)) == []


def test_not_on_transformers_mamba_with_its_cache() -> None:
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=100, hidden_size=32, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4)
    model = transformers.MambaForCausalLM(config).eval().to(torch.bfloat16)
    report = dtype_doctor.diagnose(model, {"input_ids": torch.randint(0, 100, (2, 8)), "use_cache": True})
    assert not [f for f in report.findings if f.code in ("DD119", "DD101")]
