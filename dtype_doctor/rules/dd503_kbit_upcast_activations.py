"""DD503: norms and embeddings upcast to float32 (prepare_model_for_kbit_training) around half-compute 4-bit layers."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.quantization import LINEAR_4BIT, is_quantized_linear
from dtype_doctor.records import HALF, Finding, StateTensor, TensorMeta, Trace
from dtype_doctor.rules.base import Rule


def upcast(trace: Trace) -> list[StateTensor]:
    """The float32 parameters of the model's norm layers and embeddings (not the 4-bit layers, not adapters)."""
    out = []
    for p in trace.model.parameters:
        module = p.name.rsplit(".", 1)[0]
        kind = trace.model.module_type(module)
        if p.dtype == "float32" and not is_quantized_linear(kind) and ("Norm" in kind or "Embedding" in kind):
            out.append(p)
    return out


def check(trace: Trace) -> Iterator[Finding]:
    q = trace.model.quantization
    if q is None or q.compute_dtype not in HALF:
        return
    norms = upcast(trace)
    if not norms:
        return
    fed = [m for m in trace.modules if m.phase == "forward" and m.module_type in LINEAR_4BIT
           and any(t.dtype == "float32" for t in m.inputs if t.is_floating)]
    if not fed:
        return
    first = fed[0]
    yield RULE.finding(
        f"{len(norms)} norm and embedding weights are float32 (as prepare_model_for_kbit_training leaves them) while the 4-bit "
        f"layers compute in {q.compute_dtype}: the activations between them stay float32 ({len(fed)} Linear4bit calls take "
        f"float32 inputs, cast each to {q.compute_dtype} and back) — twice the activation memory of {q.compute_dtype}, "
        f"and any {q.compute_dtype} tensor your code adds meets float32 weights",
        module=first.name,
        module_type=first.module_type,
        stage="model-loading",
        tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in norms[:3]),
        hints=(f"train under torch.autocast(dtype=torch.{q.compute_dtype}) with gradient checkpointing: the fp32 norms "
               "stay (they are there for stability), the activations between layers shrink",),
    )


RULE = Rule(
    code="DD503",
    name="kbit-upcast-activations",
    severity="info",
    summary="Norms and embeddings upcast to float32 (prepare_model_for_kbit_training) around 4-bit layers that compute in half: float32 activations.",
    why=(
        "peft's prepare_model_for_kbit_training casts every non-quantized floating parameter to float32 for stable "
        "training. The embeddings then emit float32, the norms keep it, and each Linear4bit casts its float32 input to "
        "the half compute dtype and its output back to float32: the memory a half model was chosen to save is spent on "
        "activations, and half tensors added by other code meet float32 weights (\"expected scalar type Float but found Half\")."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float16, quantization_config=BitsAndBytesConfig(\n"
        "    load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16))\n"
        "model = prepare_model_for_kbit_training(model)   # norms, embeddings, lm_head → float32\n"
        "model(**batch)   # every Linear4bit: float32 in, float16 matmul, float32 out"
    ),
    fix="Expected for the QLoRA recipe; train under autocast in the compute dtype with gradient checkpointing to bound the activations.",
    fix_safety="display-only: the float32 norms are the recipe's choice for stability.",
    check=check,
    references=("https://huggingface.co/docs/peft/developer_guides/quantization",),
    device_note=(
        "The same on CPU and CUDA. 4-bit only: an 8-bit model has no compute dtype to contradict — "
        "prepare_model_for_kbit_training casts every non-int8 parameter to float32, which is what a float32 8-bit load "
        "has anyway, and Linear8bitLt quantizes its input via float16 whatever it is (tests/test_rules_8bit.py)."
    ),
)
