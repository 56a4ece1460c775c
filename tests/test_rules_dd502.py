"""DD502 lora-adapter-dtype: float32 LoRA adapters on a bfloat16-compute 4-bit layer, with real peft and bitsandbytes."""

import pytest
import torch
import torch.nn as nn

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
peft = pytest.importorskip("peft", reason="peft is not installed (pip install 'dtype-doctor[quant]')")

import dtype_doctor  # noqa: E402
from dtype_doctor.fix.engine import fix_model  # noqa: E402


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=torch.bfloat16).to("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Uncast(nn.Module):
    """A step that turns peft's input casting off, as layer-wise casting hooks do."""

    def __init__(self) -> None:
        super().__init__()
        self.model = peft.get_peft_model(Base(), peft.LoraConfig(r=4, target_modules=["proj"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with peft.helpers.disable_input_dtype_casting(self.model):
            return self.model(x)


X = torch.randn(2, 64, dtype=torch.bfloat16)


def test_float32_adapters_meet_bf16_activations_uncast() -> None:
    model = Uncast()
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}  # peft's default
    with pytest.raises(RuntimeError):
        model(X)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(X).dtype == torch.bfloat16  # autocast casts per matmul; the adapters stay float32
    report = dtype_doctor.diagnose(model, {"x": X})
    [f] = [f for f in report.findings if f.code == "DD502"]
    assert f.severity == "error" and [t.dtype for t in f.tensors] == ["bfloat16", "float32"]
    assert [(r.strategy, r.to) for r in f.remedies] == [("autocast", "bfloat16")]
    assert {(a.kind, a.dtype) for a in report.target.quantization.adapters} == {("lora_A", "float32"), ("lora_B", "float32")}


def test_the_autocast_fix_verifies_with_adapters_kept_float32() -> None:
    result = fix_model(Uncast(), {"x": X}, strategy="autocast", measure=False)
    assert result.verified
    after = result.pipeline.model
    assert {p.dtype for n, p in after.named_parameters() if "lora_" in n} == {torch.float32}


def test_peft_casting_the_input_is_not_reported() -> None:
    model = peft.get_peft_model(Base(), peft.LoraConfig(r=4, target_modules=["proj"]))
    assert model(X).dtype == torch.bfloat16
    assert "DD502" not in {f.code for f in dtype_doctor.diagnose(model, {"x": X}).findings}
