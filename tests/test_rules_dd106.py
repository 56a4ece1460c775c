"""DD106 attention-mask-dtype: a mask SDPA rejects (error) or that differs from the query (warning)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from helpers_models import found, load_fixture, token_batch


class SelfAttention(nn.Module):
    """A hand-written block that passes the padding mask straight to SDPA."""

    def __init__(self, dim: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, h, mask):
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2).reshape(b, t, d)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([SelfAttention(), SelfAttention()])

    def forward(self, hidden, attention_mask):
        for block in self.blocks:
            hidden = block(hidden, attention_mask)
        return hidden


def batch(mask_dtype, hidden_dtype=torch.float32):
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    if mask_dtype.is_floating_point:
        mask = (1.0 - mask.to(mask_dtype)) * torch.finfo(mask_dtype).min  # additive
    else:
        mask = mask.to(mask_dtype)
    return {"hidden": torch.randn(2, 5, 8, dtype=hidden_dtype), "attention_mask": mask}


@pytest.mark.parametrize("simulate", [False, True])
def test_int64_padding_mask_straight_into_sdpa(simulate):
    model, inputs = Encoder(), batch(torch.long)
    with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float or to match query dtype"):
        model(**inputs)
    report = dtype_doctor.diagnose(model, inputs, simulate=simulate, device="cpu")
    hits = found(report, "DD106")
    # PyTorch stops in blocks.0; the doctor names both blocks that would fail.
    assert [(f.module, f.severity) for f in hits] == [("blocks.0", "error"), ("blocks.1", "error")]
    f = hits[0]
    assert f.op == "torch.nn.functional.scaled_dot_product_attention"
    assert f.stage == "collator"  # a view of the batch's mask: its dtype came with the batch
    assert f.tensors[1].name == "attention_mask"
    assert [t.role for t in f.tensors] == ["input", "mask"] and f.tensors[1].dtype == "int64"
    assert "int64" in f.message and "bool" in f.message
    assert found(report, "DD101") == []


def test_half_mask_with_fp32_query_is_an_error():
    model, inputs = Encoder(), batch(torch.float16)
    with pytest.raises(RuntimeError, match="Expected attn_mask dtype"):
        model(**inputs)
    assert {f.severity for f in found(dtype_doctor.diagnose(model, inputs), "DD106")} == {"error"}


def test_float32_mask_with_fp16_query_is_a_warning():
    model = Encoder().half()
    inputs = batch(torch.float32, torch.float16)
    assert model(**inputs).dtype == torch.float16  # PyTorch accepts it
    hits = found(dtype_doctor.diagnose(model, inputs), "DD106")
    assert {(f.module, f.severity) for f in hits} == {("blocks.0", "warning"), ("blocks.1", "warning")}
    assert "float32" in hits[0].message and "float16" in hits[0].message


@pytest.mark.parametrize("mask_dtype,hidden_dtype", [(torch.bool, torch.float32), (torch.bool, torch.float16), (torch.float16, torch.float16), (torch.float32, torch.float32)])
def test_accepted_masks_are_not_reported(mask_dtype, hidden_dtype):
    model = Encoder().to(hidden_dtype)
    inputs = batch(mask_dtype, hidden_dtype)
    model(**inputs)
    assert dtype_doctor.diagnose(model, inputs).findings == ()


def test_float64_mask_is_not_cast_by_autocast():
    model, inputs = Encoder(), batch(torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="attn_mask.dtype: double"):
        model(**inputs)
    for simulate in (False, True):
        report = dtype_doctor.diagnose(model, inputs, autocast="bfloat16", simulate=simulate, device="cpu")
        assert {(f.module, f.severity) for f in found(report, "DD106")} == {("blocks.0", "error"), ("blocks.1", "error")}


@pytest.mark.parametrize("mask_dtype", [torch.float16, torch.float32, torch.bool])
def test_masks_autocast_casts_are_not_reported(mask_dtype):
    model, inputs = Encoder(), batch(mask_dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(**inputs)
    assert dtype_doctor.diagnose(model, inputs, autocast="bfloat16").findings == ()


@pytest.fixture(scope="module")
def hf_models():
    cache = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            cache[name, dtype] = load_fixture(name, dtype=dtype)
        return cache[name, dtype]

    return get


@pytest.mark.parametrize("name", ["bert-tiny", "llama-tiny"])
@pytest.mark.parametrize("model_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.bool])
def test_hf_models_convert_their_own_2d_padding_mask(hf_models, name, model_dtype, mask_dtype):
    model = hf_models(name, model_dtype)
    assert model.config._attn_implementation == "sdpa"  # the kernel that would reject an int mask
    inputs = token_batch()
    inputs["attention_mask"] = inputs["attention_mask"].to(mask_dtype)
    model(**inputs)
    report = dtype_doctor.diagnose(model, inputs)
    assert report.findings == ()
    assert any("scaled_dot_product" in op.op for op in report.trace.ops)
