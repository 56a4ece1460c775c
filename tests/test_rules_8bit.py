"""Which DD5xx behaviours are real for 8-bit: real bitsandbytes `Linear8bitLt` (LLM.int8) on the CPU.

What bitsandbytes 0.50 does (autograd/_functions.py `matmul`): an 8-bit layer in eval runs
MatMul8bitLt, which casts a non-float16 input to float16 to quantize it (logging "inputs will
be cast from … to float16") and returns the input's dtype; in training on the CPU it runs
MatMul8bitFp, which dequantizes the int8 weight to the input's dtype (no float16 cast; on CUDA
training takes MatMul8bitLt too). There is no compute dtype to set, so DD501 is 4-bit's alone;
DD502 (adapters) and DD504 (FSDP) are real for 8-bit; DD503 stays 4-bit's (see its note); a
direct matmul with the int8 weight is refused, which DD101 names.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
peft = pytest.importorskip("peft", reason="peft is not installed (pip install 'dtype-doctor[quant]')")

from helpers_models import FIXTURE_MODELS, lm_batch  # noqa: E402

import dtype_doctor  # noqa: E402


class Net(nn.Module):
    def __init__(self, head: torch.dtype | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(64, 64).to(head).requires_grad_(False) if head is not None else None
        self.proj = bnb.nn.Linear8bitLt(64, 32, bias=False, has_fp16_weights=False).to("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.head(x) if self.head is not None else x)


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def quantize_op(report, module: str = "proj"):
    return next(o for o in report.trace.ops if o.module == module and "int8_vectorwise_quant" in o.op)


def test_an_8bit_layer_quantizes_its_input_via_float16_in_eval_and_dd108_says_so() -> None:
    net = Net().eval()
    assert net.proj.weight.dtype == torch.int8 and not hasattr(net.proj, "compute_dtype")  # no compute dtype
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert net(x).dtype == torch.bfloat16  # the output comes back in the input's dtype
    report = dtype_doctor.diagnose(net, {"x": x})
    assert quantize_op(report).operands[0].dtype == "float16"  # bitsandbytes' own cast, recorded
    [f] = [f for f in report.findings if f.code == "DD108"]
    assert "bfloat16" in f.message and "float16" in f.message and f.module_type == "Linear8bitLt"
    assert "DD501" not in codes(report)  # the slow-path rule is about a compute dtype 8-bit does not have
    half = dtype_doctor.diagnose(Net().eval(), {"x": x.half()})
    assert not {"DD108", "DD501"} & codes(half)


def test_in_training_on_the_cpu_an_8bit_layer_multiplies_in_the_inputs_dtype() -> None:
    net = Net().train()
    report = dtype_doctor.diagnose(net, {"x": torch.randn(4, 64, dtype=torch.bfloat16)}, train=True)
    assert not any("int8_vectorwise_quant" in o.op for o in report.trace.ops)  # MatMul8bitFp: no float16 cast
    mm = [o for o in report.trace.ops if o.module == "proj" and o.op.startswith("aten.mm")]
    assert mm and mm[0].operands[0].dtype == "bfloat16" and mm[0].operands[1].dtype == "bfloat16"
    assert not {"DD108", "DD501"} & codes(report)


def test_lora_adapters_on_an_8bit_base_are_refused_without_the_cast_and_dd502_names_them() -> None:
    from peft.helpers import disable_input_dtype_casting

    model = peft.get_peft_model(Net(), peft.LoraConfig(r=4, target_modules=["proj"])).eval()
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert model(x).dtype == torch.bfloat16  # peft casts the adapter's input: runs
    with disable_input_dtype_casting(model), pytest.raises(RuntimeError):
        model(x)  # "expected m1 and m2 to have the same dtype" (CPU wording varies)
    with disable_input_dtype_casting(model):
        report = dtype_doctor.diagnose(model, {"x": x})
    [f] = [f for f in report.findings if f.code == "DD502"]
    assert {t.dtype for t in f.tensors} == {"bfloat16", "float32"}
    assert [r.strategy for r in f.remedies] == ["autocast"]
    assert report.target.quantization.method == "bitsandbytes-8bit"


def test_a_direct_matmul_with_the_int8_weight_is_refused_and_dd101_names_it() -> None:
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = Net().proj

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.proj.weight)  # bypasses Linear8bitLt: its int8 bytes as a weight

    x = torch.randn(4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        Direct()(x)
    report = dtype_doctor.diagnose(Direct(), {"x": x})
    [f] = [f for f in report.findings if f.code == "DD101"]
    assert {t.dtype for t in f.tensors} >= {"float16", "int8"}


def test_fsdp_refuses_int8_weights_and_dd504_says_8bit_has_no_storage_option() -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with pytest.raises(ValueError, match="uniform dtype"):
            FullyShardedDataParallel(Net(torch.bfloat16), device_id=torch.device("cpu"))
        with pytest.raises(ValueError, match="integer"):
            FullyShardedDataParallel(Net(), device_id=torch.device("cpu"))  # int8 alone: refused too
    finally:
        dist.destroy_process_group()
    report = dtype_doctor.diagnose(Net(torch.bfloat16).eval(), {"x": torch.randn(2, 64, dtype=torch.bfloat16)})
    [f] = [f for f in report.findings if f.code == "DD504"]
    assert f.severity == "info" and f.module == "proj" and f.remedies == ()  # no keyword fixes 8-bit
    assert "bnb_4bit_quant_storage" in f.fixes[0].description and f.fixes[0].applicability == "display-only"


def test_prepare_model_for_kbit_training_on_8bit_upcasts_all_but_int8_and_dd503_stays_4bit() -> None:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    model = AutoModelForCausalLM.from_pretrained(FIXTURE_MODELS / "llama-tiny", quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                                 dtype=torch.float16, device_map="cpu")
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    floating = {p.dtype for p in model.parameters() if p.is_floating_point()}
    assert floating == {torch.float32}  # norms, embeddings and head: every non-int8 parameter
    report = dtype_doctor.diagnose(model.eval(), lm_batch())
    q_proj = next(m for m in report.trace.modules if m.name == "model.layers.0.self_attn.q_proj")
    assert q_proj.inputs[0].dtype == "float32"
    assert quantize_op(report, "model.layers.0.self_attn.q_proj").operands[0].dtype == "float16"
    # the same as a float32 8-bit load: no compute dtype was asked for, so no upcast to name
    assert "DD503" not in codes(report)
