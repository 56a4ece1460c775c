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


def lora_everywhere_tower() -> nn.Module:
    """LoRA on every bias-free linear (as PEFT's target_modules="all-linear" does on Llama):
    the trainable adapter tensors outnumber the frozen base tensors."""
    model = Tower()
    for i in range(len(model.layers)):
        model.layers[i] = nn.Linear(16, 16, bias=False)
    model.out = nn.Linear(16, 4, bias=False)
    model.half().requires_grad_(False)
    for i, layer in enumerate(model.layers):
        model.layers[i] = LoRALinear(layer)
    return model


def test_lora_on_every_linear_of_a_frozen_half_base_is_not_reported():
    model = lora_everywhere_tower()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) > len(list(model.parameters())) / 2  # more adapter tensors than base ones
    ids = torch.randint(0, 50, (2, 5))
    model(ids).float().sum().backward()  # PyTorch runs and trains it
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable)

    assert dtype_doctor.diagnose(model, {"input_ids": ids}, train=True).findings == ()


def test_fp32_head_larger_than_its_frozen_half_backbone_is_not_reported():
    """Counted by elements the fp32 head is "the model"; the frozen backbone still sets its dtype."""
    model = Tower().half().requires_grad_(False)
    model.out = nn.Linear(16, 4096)  # trainable fp32, more elements than the backbone
    assert model.out.weight.numel() > sum(p.numel() for p in model.parameters() if not p.requires_grad)
    ids = torch.randint(0, 50, (2, 5))
    with torch.autocast("cpu", dtype=F16):
        model(ids).float().sum().backward()  # AMP accepts fp32 weights
    assert dtype_doctor.diagnose(model, {"input_ids": ids}, autocast="float16", train=True).findings == ()


class ModulesToSave(nn.Module):
    """PEFT's ModulesToSaveWrapper: the frozen original beside a trainable copy that is used."""

    def __init__(self, original: nn.Module, copy: nn.Module):
        super().__init__()
        self.original_module = original
        self.modules_to_save = nn.ModuleDict({"default": copy})

    def forward(self, x):
        return self.modules_to_save["default"](x)


def test_fp32_modules_to_save_on_a_frozen_half_base_are_not_reported():
    model = adapted_tower(freeze=True)
    model.out = ModulesToSave(model.out, nn.Linear(16, 4))  # the trained copy upcast to fp32
    ids = torch.randint(0, 50, (2, 5))
    with torch.autocast("cpu", dtype=F16):
        model(ids).float().sum().backward()
    assert dtype_doctor.diagnose(model, {"input_ids": ids}, autocast="float16", train=True).findings == ()


def test_an_fp32_frozen_module_in_a_frozen_half_base_is_still_reported():
    """Control: only trainable fp32 modules are exempt, not an fp32 layer left in the base."""
    model = adapted_tower(freeze=True)
    model.layers[1].base.float().requires_grad_(False)
    [f] = found(dtype_doctor.diagnose(model, {"input_ids": torch.randint(0, 50, (2, 5))}), "DD102")
    assert f.module == "layers.1.base" and "float16 model" in f.message
