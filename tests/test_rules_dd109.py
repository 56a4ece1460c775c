"""DD109 buffer-precision-loss: a buffer that must stay fp32 (rotary inv_freq) was cast to half.

The bound: a half copy of the rotary frequencies fails when, at the model's longest position,
some angle is off by half a position or more. PyTorch first: the rotary embedding of a bf16 model
at position 4095 against the float32 one; then the doctor, for a long and a short context.
"""

from __future__ import annotations

import pytest
import torch

import dtype_doctor
from dtype_doctor.trace.rope import phase_error, reference_inv_freq
from dtype_doctor.rules.dd109_buffer_precision_loss import POSITION_BOUND
from helpers_models import found, load_fixture, token_batch

INV_FREQ = "model.rotary_emb.inv_freq"


def buffer_dtypes(model):
    return dict(model.named_buffers())


def long_llama(max_position: int = 4096, head_dim: int = 128):
    """A one-layer Llama with Llama-2's head_dim and a 4096-token context, built from its config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=head_dim, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=head_dim,
                         max_position_embeddings=max_position)
    return LlamaForCausalLM(config).eval()


def test_bf16_rotary_at_position_4095_is_off() -> None:
    full = long_llama()
    half = long_llama().to(torch.bfloat16)
    assert buffer_dtypes(half)[INV_FREQ].dtype == torch.bfloat16  # .to() cast the buffer too
    x = torch.zeros(1, 1, 128)
    position = torch.tensor([[4095]])
    cos32, sin32 = full.model.rotary_emb(x, position)
    cos16, sin16 = half.model.rotary_emb(x.bfloat16(), position)
    # measured: cos off by up to 1.68 and sin by 1.64 at 4095 (head_dim 128, theta 10000); nothing raises
    assert (cos16.float() - cos32).abs().max() > 1.0 and (sin16.float() - sin32).abs().max() > 1.0
    radians, positions = phase_error(reference_inv_freq(full.model.rotary_emb), 4095, torch.bfloat16)
    assert 4.5 < radians < 5.5 and positions > 4  # 5.0 rad, the angle of ~8 positions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_context_model_cast_to_half_is_found(dtype: torch.dtype) -> None:
    model = long_llama().to(dtype)
    batch = token_batch(vocab=60)
    model(**batch)  # runs: the loss of precision is silent
    report = dtype_doctor.diagnose(model, batch)
    [f] = found(report, "DD109")
    assert (f.severity, f.module, f.module_type, f.stage) == ("warning", "model.rotary_emb", "LlamaRotaryEmbedding", "model-loading")
    assert INV_FREQ in {t.name for t in f.tensors}
    assert {t.dtype for t in f.tensors} == {str(dtype).removeprefix("torch.")}
    assert "position 4095" in f.message and "positions" in f.message


def test_short_context_rounding_is_within_the_bound() -> None:
    """llama-tiny has 128 positions: bf16 frequencies move its angles by under half a position."""
    model = load_fixture("llama-tiny").to(torch.bfloat16)
    assert buffer_dtypes(model)[INV_FREQ].dtype == torch.bfloat16
    _, positions = phase_error(reference_inv_freq(model.model.rotary_emb), 127, torch.bfloat16)
    assert positions < POSITION_BOUND
    assert found(dtype_doctor.diagnose(model, token_batch()), "DD109") == []


def test_simulated_model_is_judged_the_same() -> None:
    """No buffer value is read: the frequencies are recomputed from the config."""
    with torch.device("meta"):
        model = long_llama()
    model = model.to(torch.bfloat16)
    report = dtype_doctor.diagnose(model, {k: v.to("meta") for k, v in token_batch(vocab=60).items()})
    assert [f.module for f in found(report, "DD109")] == ["model.rotary_emb"]


def test_from_pretrained_with_dtype():
    """What transformers does with inv_freq when asked for bf16 at load, and the doctor agrees."""
    model = load_fixture("llama-tiny", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    kept_fp32 = buffer_dtypes(model)[INV_FREQ].dtype == torch.float32
    assert kept_fp32, "transformers 5 keeps the rotary buffer fp32 when loading with dtype="
    report = dtype_doctor.diagnose(model, token_batch())
    assert found(report, "DD109") == []


def test_fp32_model_is_clean():
    model = load_fixture("llama-tiny")
    assert dtype_doctor.diagnose(model, token_batch()).findings == ()


def test_a_cache_buffer_without_a_known_rope_is_reported_as_before() -> None:
    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos_cached", torch.ones(8, 4), persistent=False)
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * self.cos_cached[: x.shape[0]]

    model = Rotary().to(torch.bfloat16)
    [f] = found(dtype_doctor.diagnose(model, {"x": torch.randn(8, 4).bfloat16()}), "DD109")
    assert f.tensors[0].name == "cos_cached"
