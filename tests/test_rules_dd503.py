"""DD503 kbit-upcast-activations: peft's prepare_model_for_kbit_training on a real 4-bit tiny Llama."""

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
peft = pytest.importorskip("peft", reason="peft is not installed (pip install 'dtype-doctor[quant]')")

from helpers_models import llama_4bit, lm_batch  # noqa: E402

import dtype_doctor  # noqa: E402


def test_prepare_model_for_kbit_training_upcasts_norms_and_activations() -> None:
    model = peft.prepare_model_for_kbit_training(llama_4bit(), use_gradient_checkpointing=False)
    assert model.model.layers[0].input_layernorm.weight.dtype == torch.float32  # peft's own upcast
    report = dtype_doctor.diagnose(model, lm_batch(), train=True)
    [f] = [f for f in report.findings if f.code == "DD503"]
    assert f.severity == "info" and all(t.dtype == "float32" for t in f.tensors)
    # the 4-bit layers really took float32 activations and multiplied in float16
    q_proj = [m for m in report.trace.modules if m.name == "model.layers.0.self_attn.q_proj"][0]
    assert q_proj.inputs[0].dtype == "float32"
    gemm = [o for o in report.trace.ops if o.module == "model.layers.0.self_attn.q_proj" and "gemm_4bit" in o.op][0]
    assert gemm.operands[0].dtype == "float16" and gemm.operands[1].dtype == "uint8"


def test_a_half_model_without_the_upcast_is_not_reported() -> None:
    model = llama_4bit()
    assert model.model.layers[0].input_layernorm.weight.dtype == torch.float16
    report = dtype_doctor.diagnose(model, lm_batch())
    assert "DD503" not in {f.code for f in report.findings}
