"""DD118 ssm-decay-exp-half: the decay exp(A_log) / exp(dt·A) computed in 16 bits. First the real
loss: in bfloat16 a step's decay at Mamba's time_step_min rounds to exactly 1.0; then a Mamba port
in the common public shape (`A = -torch.exp(self.A_log)`, no upcast) is named on a bf16 model, and
transformers' own Mamba (which writes A_log.float()) is not, nor the port in float32."""

from __future__ import annotations


import torch
import transformers
from torch import nn
from torch.nn import functional as F

import dtype_doctor


def test_a_bf16_decay_rounds_to_one() -> None:
    dt, a = torch.tensor(0.001), torch.tensor(-1.0)  # time_step_min, the first of Mamba's A = -(1..16)
    assert torch.exp(dt * a).item() < 1.0
    assert torch.exp((dt * a).to(torch.bfloat16)).item() == 1.0  # the state keeps everything
    a_log = torch.log(torch.arange(1, 17, dtype=torch.float32))
    decay32 = torch.exp(0.01 * -torch.exp(a_log))
    decay16 = torch.exp(0.01 * -torch.exp(a_log.to(torch.bfloat16))).float()
    # over 1000 steps the decays' products drift apart
    assert (decay16.log() * 1000 - decay32.log() * 1000).abs().max().item() > 0.1


class PortMixer(nn.Module):
    """A selective scan as many public Mamba ports write it: the decay with no float32 upcast."""

    def __init__(self, d_inner: int = 16, d_state: int = 8) -> None:
        super().__init__()
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.dt_proj = nn.Linear(d_inner, d_inner)
        self.x_proj = nn.Linear(d_inner, 2 * d_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, length, d_inner)
        A = -torch.exp(self.A_log)
        dt = F.softplus(self.dt_proj(x))
        B, C = self.x_proj(x).chunk(2, dim=-1)
        decay = torch.exp(dt.unsqueeze(-1) * A)
        state, ys = x.new_zeros(x.shape[0], x.shape[2], A.shape[1]), []
        for t in range(x.shape[1]):
            state = decay[:, t] * state + (dt[:, t].unsqueeze(-1) * B[:, t].unsqueeze(1)) * x[:, t].unsqueeze(-1)
            ys.append((state * C[:, t].unsqueeze(1)).sum(-1))
        return torch.stack(ys, 1) + x * self.D


class Port(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mixer = PortMixer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(x)


def dd118(report) -> list:
    return [f for f in report.findings if f.code == "DD118"]


def test_named_on_a_bf16_port() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    [f] = dd118(dtype_doctor.diagnose(Port().to(torch.bfloat16), {"x": x.to(torch.bfloat16)}))
    assert f.module == "mixer" and f.severity == "warning" and "bfloat16" in f.message
    assert f.fixes[0].strategy == "autocast"
    assert not dd118(dtype_doctor.diagnose(Port(), {"x": x}))


def test_not_on_transformers_mamba_which_upcasts() -> None:
    torch.manual_seed(0)
    config = transformers.MambaConfig(vocab_size=100, hidden_size=32, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4)
    model = transformers.MambaForCausalLM(config).eval().to(torch.bfloat16)
    report = dtype_doctor.diagnose(model, {"input_ids": torch.randint(0, 100, (2, 8))})
    assert not dd118(report) and [f.code for f in report.findings if f.code == "DD117"] == ["DD117"]
