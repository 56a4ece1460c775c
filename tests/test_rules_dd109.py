"""DD109 buffer-precision-loss: a buffer that must stay fp32 (rotary inv_freq) was cast to half."""

from __future__ import annotations

import pytest
import torch

import dtype_doctor
from helpers_models import found, load_fixture, token_batch

INV_FREQ = "model.rotary_emb.inv_freq"


def buffer_dtypes(model):
    return dict(model.named_buffers())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_to_half_after_loading_casts_inv_freq(dtype):
    model = load_fixture("llama-tiny").to(dtype)
    assert buffer_dtypes(model)[INV_FREQ].dtype == dtype  # .to() cast the buffer too
    batch = token_batch()
    model(**batch)  # and nothing fails: the loss of precision is silent

    report = dtype_doctor.diagnose(model, batch)
    [f] = report.findings
    assert (f.code, f.severity, f.module, f.module_type) == ("DD109", "warning", "model.rotary_emb", "LlamaRotaryEmbedding")
    assert f.stage == "model-loading"
    assert INV_FREQ in {t.name for t in f.tensors}
    assert {t.dtype for t in f.tensors} == {str(dtype).removeprefix("torch.")}


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
