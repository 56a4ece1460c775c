"""DD502: LoRA adapters whose dtype is not the activations' reaching them, with nothing to cast between."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.quantization import ADAPTER_KINDS
from dtype_doctor.records import Finding, OpCall, TensorMeta, Trace
from dtype_doctor.rules._common import autocast_remedy
from dtype_doctor.rules.base import Rule


def adapter_weight(op: OpCall) -> TensorMeta | None:
    """The LoRA weight among `op`'s operands ("….lora_A.default.weight"), if any."""
    for t in op.operands:
        if t.role == "weight" and t.name and any(f".{k}." in f".{t.name}" for k in ADAPTER_KINDS):
            return t
    return None


def refused_adapters(trace: Trace) -> list[tuple[OpCall, TensorMeta, TensorMeta]]:
    """(op, adapter weight, activation) for each adapter matmul PyTorch refused for their dtypes."""
    out = []
    for op in trace.ops:
        if op.phase != "forward" or op.error is None:
            continue
        w = adapter_weight(op)
        x = next((t for t in op.operands if t.role == "input" and t.is_floating), None)
        if w is not None and x is not None and w.dtype != x.dtype:
            out.append((op, w, x))
    return out


def check(trace: Trace) -> Iterator[Finding]:
    refused = refused_adapters(trace)
    if not refused:
        return
    op, w, x = refused[0]
    modules = sorted({o.module for o, _, _ in refused})
    yield RULE.finding(
        f"{len(modules)} LoRA adapter layer{'s' if len(modules) != 1 else ''} hold {w.dtype} weights but receive {x.dtype} "
        f"activations with nothing casting between them: peft casts an adapter's input to its dtype only outside CUDA "
        f"autocast and while input casting is enabled — run the step under {x.dtype} autocast and keep the adapters {w.dtype}",
        module=op.module,
        module_type=op.module_type,
        op=op.op,
        stage="model-code",
        tensors=(x, w),
        pytorch_error=op.error,
        remedies=(autocast_remedy(x.dtype),),
    )


RULE = Rule(
    code="DD502",
    name="lora-adapter-dtype",
    severity="error",
    summary="LoRA adapters (float32, as peft keeps them) meet half activations from a half-compute base with no cast between.",
    why=(
        "QLoRA keeps the base in 4 bits computing in bfloat16/float16 and the adapters in float32 for training. peft "
        "bridges the two by casting the adapter's input — but not under CUDA autocast (it relies on autocast there) and "
        "not when input casting is disabled (peft.helpers.disable_input_dtype_casting, layer-wise casting). Without a "
        "cast the adapter's matmul gets a half input and a float32 weight: \"expected scalar type Float but found "
        "BFloat16\" / \"expected m1 and m2 to have the same dtype\"."
    ),
    example=(
        "model = get_peft_model(qlora_base, LoraConfig(r=8, target_modules=['q_proj']))   # adapters float32\n"
        "with disable_input_dtype_casting(model):\n"
        "    model(x_bf16)\n"
        "RuntimeError: expected m1 and m2 to have the same dtype, but got: c10::BFloat16 != float"
    ),
    fix="Run the step under torch.autocast in the compute dtype; the adapters stay float32 (their master weights), autocast casts per matmul.",
    fix_safety="autocast is safe: no weight changes dtype.",
    check=check,
    references=("https://huggingface.co/docs/peft/developer_guides/quantization",),
    device_note="The same refusal on CPU and CUDA; on CUDA, peft leaves the cast to autocast whenever CUDA autocast is on.",
)
