"""DD103 index-dtype: an index tensor whose dtype the op rejects."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import found, load_fixture, token_batch


@pytest.fixture(scope="module")
def bert():
    return load_fixture("bert-tiny")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float_input_ids_into_bert(bert, dtype):
    batch = token_batch()
    bad = {**batch, "input_ids": batch["input_ids"].to(dtype)}
    with pytest.raises(RuntimeError, match="Expected tensor for argument #1 'indices'"):
        bert(**bad)

    for simulate in (False, True):
        report = dtype_doctor.diagnose(bert, bad, simulate=simulate, device="cpu")
        [f] = found(report, "DD103")
        assert (f.severity, f.module, f.module_type) == ("error", "bert.embeddings.word_embeddings", "Embedding")
        assert f.op == "aten.embedding.default"
        assert f.stage == "collator"
        assert [(t.name, t.dtype) for t in f.tensors] == [("input_ids", str(dtype).removeprefix("torch."))]
        assert [x.strategy for x in f.fixes] == ["cast-inputs"]
        assert report.trace.failure is None  # repaired and traced to the end
    assert f.pytorch_error is not None


def test_a_whole_batch_cast_to_half(bert):
    """The usual way it happens: `{k: v.half() for k, v in batch.items()}`."""
    batch = {k: v.half() for k, v in token_batch().items()}
    with pytest.raises(RuntimeError, match="indices"):
        bert(**batch)
    report = dtype_doctor.diagnose(bert, batch)
    assert [f.module for f in found(report, "DD103")] == ["bert.embeddings.word_embeddings"]


def test_int32_ids_and_mask_are_accepted(bert):
    batch = {k: v.int() for k, v in token_batch().items()}
    bert(**batch)
    assert dtype_doctor.diagnose(bert, batch).findings == ()


def test_int64_ids_with_half_weights_are_accepted():
    model = load_fixture("bert-tiny", dtype=torch.float16)
    batch = token_batch()
    model(**batch)
    assert dtype_doctor.diagnose(model, batch).findings == ()


class Pick(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x, index):
        if self.how == "gather":
            return torch.gather(x, 1, index)
        if self.how == "index_select":
            return torch.index_select(x, 0, index)
        return x[index]


@pytest.mark.parametrize(
    "how,dtype,rejected",
    [
        ("gather", torch.float32, True),
        ("gather", torch.int16, True),
        ("gather", torch.int32, False),
        ("index_select", torch.float32, True),
        ("index_select", torch.uint8, True),
        ("index_select", torch.int32, False),
        ("index", torch.int16, True),
        ("index", torch.float32, True),
        ("index", torch.int32, False),
    ],
)
def test_custom_index_ops(how, dtype, rejected):
    x = torch.randn(4, 4)
    index = torch.tensor([[0, 1], [1, 0]] if how == "gather" else [0, 2]).to(dtype)
    model = Pick(how)
    report = dtype_doctor.diagnose(model, {"x": x, "index": index})
    if rejected:
        with pytest.raises((RuntimeError, IndexError), match="index|indices"):
            model(x, index)
        [f] = found(report, "DD103")
        assert f.severity == "error" and f.op.startswith(f"aten.{how}")
    else:
        model(x, index)
        assert report.findings == ()


def test_take_along_dim_int32_indices():
    class Take(nn.Module):
        def forward(self, x, index):
            return torch.take_along_dim(x, index, 1)

    x, index = torch.randn(2, 4), torch.tensor([[0], [3]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="dtype of indices should be Long"):
        Take()(x, index)
    assert [f.module for f in found(dtype_doctor.diagnose(Take(), {"x": x, "index": index}), "DD103")] == [""]


@pytest.mark.slow
def test_minilm_with_a_half_batch():
    from helpers_models import load_minilm

    model, enc = load_minilm()
    half = {k: v.half() for k, v in enc.items()}
    with pytest.raises(RuntimeError, match="'indices'"):
        model(**half)
    report = dtype_doctor.diagnose(model, half)
    # PyTorch names the first embedding; the doctor names both that would fail.
    assert {f.module for f in found(report, "DD103")} == {
        "embeddings.word_embeddings",
        "embeddings.token_type_embeddings",
    }
    model(**enc)
    assert dtype_doctor.diagnose(model, enc).findings == ()


WRITES = {
    "index_add": lambda x, i, src: x.index_add(0, i, src),
    "index_copy": lambda x, i, src: x.index_copy(0, i, src),
    "scatter_add": lambda x, i, src: x.scatter_add(0, i, src),
    "put": lambda x, i, src: x.put(i, src),
}


class Write(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, x, index, src):
        return WRITES[self.how](x, index, src)


@pytest.mark.parametrize("how", sorted(WRITES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int16])
def test_index_writes_are_explained_by_dd103_exactly_when_the_kernel_refuses(how, dtype):
    x, src, index = torch.zeros(5), torch.ones(3), torch.tensor([0, 1, 2], dtype=dtype)
    model = Write(how)
    try:
        model(x, index, src)
        refused = False
    except RuntimeError:
        refused = True
    report = dtype_doctor.diagnose(model, {"x": x, "index": index, "src": src})
    assert [f.code for f in report.findings] == (["DD103"] if refused else [])
