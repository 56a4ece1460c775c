"""DD501: a bitsandbytes 4-bit layer computing in float32 while its inputs are half: the slow path."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.quantization import LINEAR_4BIT, MATMUL_4BIT, bnb_op
from dtype_doctor.records import HALF, Finding, ModuleCall, OpCall, Remedy, TensorMeta, Trace
from dtype_doctor.rules.base import Rule


def slow_layers(trace: Trace) -> list[tuple[OpCall, TensorMeta]]:
    """(the 4-bit matmul, the layer's input) for each 4-bit layer given a half input it computes in float32.

    bitsandbytes' Linear4bit casts its input to `compute_dtype` and the result back
    (`bnb.matmul_4bit(x.to(compute_dtype), …).to(inp_dtype)`): the matmul's first operand, as
    recorded, is the dtype the layer really computed in."""
    inputs: dict[str, ModuleCall] = {m.name: m for m in trace.modules if m.phase == "forward" and m.module_type in LINEAR_4BIT}
    out: list[tuple[OpCall, TensorMeta]] = []
    seen: set[str] = set()
    for op in trace.ops:
        if op.phase != "forward" or bnb_op(op.op) not in MATMUL_4BIT or not op.operands or op.module in seen:
            continue
        call = inputs.get(op.module)
        x = next((t for t in call.inputs if t.is_floating), None) if call else None
        if x is not None and x.dtype in HALF and op.operands[0].dtype == "float32":
            seen.add(op.module)
            out.append((op, x))
    return out


def check(trace: Trace) -> Iterator[Finding]:
    if trace.model.quantization is None:
        return
    slow = slow_layers(trace)
    if not slow:
        return
    op, x = slow[0]
    dtype = x.dtype
    yield RULE.finding(
        f"{len(slow)} Linear4bit layer{'s' if len(slow) != 1 else ''} take {dtype} inputs but compute in float32 "
        f"(bnb_4bit_compute_dtype=float32, BitsAndBytesConfig's default): each casts its input to float32 and its "
        "output back, the slow path — and bitsandbytes does not warn, because the config names a compute dtype",
        severity="warning",
        module=op.module,
        module_type=op.module_type,
        op=op.op,
        stage="model-loading",
        tensors=(x, op.operands[0]),
        remedies=(Remedy("bnb-compute-dtype", "model", dtype, "model-loading"),),
    )


RULE = Rule(
    code="DD501",
    name="bnb-compute-dtype-slow-path",
    severity="warning",
    summary="A bitsandbytes 4-bit layer computes in float32 (the default bnb_4bit_compute_dtype) while its inputs are float16 or bfloat16.",
    why=(
        "Linear4bit casts every input to its compute dtype and the output back. With the default "
        "BitsAndBytesConfig the compute dtype is float32, so a float16/bfloat16 model dequantizes and multiplies "
        "in float32: slower, more memory, for no accuracy the half activations can keep. bitsandbytes warns only "
        "when the layer has no compute dtype; transformers always passes one, so the default config is silent."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float16,\n"
        "    quantization_config=BitsAndBytesConfig(load_in_4bit=True))   # compute dtype float32\n"
        "model(**batch)   # every Linear4bit: x.to(float32) → gemm_4bit in float32 → .to(float16); no warning"
    ),
    fix="Set bnb_4bit_compute_dtype to the dtype the inputs have: BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16).",
    fix_safety="bnb-compute-dtype is safe: the layer's output dtype is unchanged; the matmul runs in the half dtype.",
    check=check,
    references=("https://huggingface.co/docs/transformers/quantization/bitsandbytes",),
    device_note="The same on CPU and CUDA: the cast is in Linear4bit.forward, before any kernel.",
)
