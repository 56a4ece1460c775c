"""DD102 mixed-parameter-dtypes: floating parameters differ beyond what the model declares fp32."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import found, load_fixture, token_batch

F16 = torch.float16


@pytest.fixture(scope="module")
def batch():
    return token_batch()


def test_fp32_head_on_fp16_backbone(batch):
    model = load_fixture("bert-tiny", dtype=F16)
    model.classifier = nn.Linear(model.config.hidden_size, 3)  # a fresh head: fp32 by default
    with pytest.raises(RuntimeError, match="must have the same dtype, but got Half and Float"):
        model(**batch)

    report = dtype_doctor.diagnose(model, batch)
    [f] = found(report, "DD102")
    assert (f.severity, f.module, f.module_type, f.stage) == ("warning", "classifier", "Linear", "model-loading")
    assert {t.name for t in f.tensors} == {"classifier.weight", "classifier.bias"}
    assert {t.dtype for t in f.tensors} == {"float32"}
    assert "float16 model" in f.message
    assert [fx.strategy for fx in f.fixes] == ["half-model"]
    # The forward's own failure is DD101, at the same module.
    assert [x.module for x in found(report, "DD101")] == ["classifier"]


def test_consistent_half_model_is_clean(batch):
    model = load_fixture("bert-tiny", dtype=F16)
    model(**batch)  # int64 ids with fp16 weights: fine
    assert dtype_doctor.diagnose(model, batch).findings == ()


@pytest.fixture(scope="module")
def t5_half():
    return load_fixture("t5-tiny", dtype=F16)


def t5_batch():
    ids = torch.randint(5, 100, (2, 8))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def test_t5_keeps_wo_in_fp32_and_that_is_not_reported(t5_half):
    wo = {n: p.dtype for n, p in t5_half.named_parameters() if n.endswith("DenseReluDense.wo.weight")}
    assert wo and set(wo.values()) == {torch.float32}  # transformers kept `wo` fp32 ...
    others = {p.dtype for n, p in t5_half.named_parameters() if n not in wo}
    assert others == {F16}  # ... and everything else fp16
    batch = t5_batch()
    assert torch.isfinite(t5_half(**batch).loss)  # and the model runs as it is

    report = dtype_doctor.diagnose(t5_half, batch)
    assert found(report, "DD102") == [] and found(report, "DD101") == []
    assert report.trace.failure is None


def test_the_same_mix_without_the_declaration_is_reported(t5_half):
    """Control: the finding above is absent because of _keep_in_fp32_modules, not by luck."""
    t5_half._keep_in_fp32_modules = []
    try:
        report = dtype_doctor.diagnose(t5_half, t5_batch())
    finally:
        del t5_half._keep_in_fp32_modules
    [f] = found(report, "DD102")
    assert "wo" in f.module and f.module.endswith("DenseReluDense.wo")
    assert {t.dtype for t in f.tensors} == {"float32"}


class LoRALinear(nn.Module):
    """PEFT's pattern: the fp32 adapter casts its input to its own dtype and back."""

    def __init__(self, base: nn.Linear, r: int = 2):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)

    def forward(self, x):
        out = self.base(x)
        return out + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))).to(out.dtype)


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.out = nn.Linear(16, 4)

    def forward(self, input_ids):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.out(h)


def adapted_tower(freeze: bool) -> Tower:
    model = Tower().half()
    if freeze:
        model.requires_grad_(False)
    for i, layer in enumerate(model.layers):
        model.layers[i] = LoRALinear(layer)  # adapters are created fp32 and trainable
    return model


def test_fp32_adapters_on_frozen_half_base_are_not_reported():
    model = adapted_tower(freeze=True)
    ids = torch.randint(0, 50, (2, 5))
    assert model(ids).dtype == F16  # PyTorch runs it
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}

    report = dtype_doctor.diagnose(model, {"input_ids": ids}, train=True)
    assert report.findings == ()
    assert any(op.phase == "backward" for op in report.trace.ops)


def test_fp32_adapters_in_a_fully_trainable_half_model_are_reported():
    model = adapted_tower(freeze=False)
    [f] = found(dtype_doctor.diagnose(model, {"input_ids": torch.randint(0, 50, (2, 5))}), "DD102")
    assert f.module.startswith("layers.") and "lora_" in f.module
    assert len(f.tensors) == 6  # lora_A and lora_B weight of three layers


def test_fp32_trainable_head_on_frozen_half_base_under_autocast(batch):
    model = load_fixture("bert-tiny", dtype=F16)
    model.requires_grad_(False)
    model.classifier = nn.Linear(model.config.hidden_size, 3)  # trainable fp32 head
    with torch.autocast("cpu", dtype=F16):
        model(**batch)  # fp32 weights under autocast: accepted
    report = dtype_doctor.diagnose(model, {**batch, "labels": torch.tensor([0, 2])}, autocast="float16", train=True)
    assert report.findings == ()
