"""DD117 ssm-parameters-half: a state-space mixer's A_log, D, dt_bias held in 16 bits. First the
real loss on a tiny Mamba and Mamba-2 (configs of state-spaces/mamba-130m-hf's and
mamba2-130m's shapes, scaled down): the 16-bit A_log changes the decay A = -exp(A_log) the slow path
computes, and the model's output; then the finding, and none on the float32 model or under autocast."""

from __future__ import annotations

import pytest
import torch
import transformers

import dtype_doctor


def mamba() -> torch.nn.Module:
    torch.manual_seed(0)  # mamba-130m-hf: d_state 16, expand 2, conv_kernel 4, scaled to hidden 32, 2 layers
    config = transformers.MambaConfig(vocab_size=100, hidden_size=32, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4)
    return transformers.MambaForCausalLM(config).eval()


def mamba2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Mamba2Config(vocab_size=100, hidden_size=32, state_size=16, num_hidden_layers=2, expand=2,
                                       conv_kernel=4, num_heads=8, head_dim=8, n_groups=1, chunk_size=8)
    return transformers.Mamba2ForCausalLM(config).eval()


def dd117(report) -> list:
    return [f for f in report.findings if f.code == "DD117"]


IDS = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("build", [mamba, mamba2])
def test_a_16_bit_a_log_changes_the_decay_and_the_output(build) -> None:
    model = build()
    ssm = {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in ("A_log", "D", "dt_bias")}
    a_log = next(p for n, p in ssm.items() if n.endswith("A_log"))
    exact = -torch.exp(a_log.float())
    rounded = -torch.exp(a_log.to(torch.bfloat16).float())  # the slow path's upcast of the bf16 value
    assert 1e-3 < ((rounded - exact) / exact).abs().max().item() < 0.011  # inside the rule's bound at log 16
    with torch.no_grad():
        reference = model(IDS).logits
        for p in ssm.values():  # only these parameters rounded, all else float32
            p.copy_(p.to(torch.bfloat16).float())
        assert not torch.equal(model(IDS).logits, reference)


@pytest.mark.parametrize("build", [mamba, mamba2])
def test_named_on_the_16_bit_model(build) -> None:
    model = build().to(torch.bfloat16)
    [f] = dd117(dtype_doctor.diagnose(model, {"input_ids": IDS}))
    assert f.severity == "warning" and f.stage == "model-loading" and "A_log" in f.message and "bfloat16" in f.message
    assert f.module.endswith("mixer") and f.fixes[0].strategy == "autocast"


def test_not_on_float32_or_under_autocast() -> None:
    model = mamba()
    assert not dd117(dtype_doctor.diagnose(model, {"input_ids": IDS}))
    assert not dd117(dtype_doctor.diagnose(model, {"input_ids": IDS}, autocast="bfloat16"))
