"""DD604: an FSDP1 unit (use_orig_params=False) whose parameters cannot be flattened into one FlatParameter."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOATING, Finding, TensorMeta, Trace
from dtype_doctor.rules._common import half_model_remedy
from dtype_doctor.rules.base import Rule

# FSDP1's words (torch/distributed/fsdp/_flat_param.py, FlatParamHandle._validate_tensors_to_flatten).
INTEGER = "Cannot flatten integer dtype tensors"
MIXED = "Must flatten tensors with uniform dtype"


def check(trace: Trace) -> Iterator[Finding]:
    state = {p.name: p for p in trace.model.parameters}
    for g in trace.shards:
        if g.strategy != "fsdp" or not g.flat:
            continue
        (first, first_dtype), rest = g.flat[0], g.flat[1:]
        where = f"FSDP1 unit {g.module or 'the root'}"
        if first_dtype not in FLOATING:
            raised = INTEGER
            message = (f"{where} would flatten {first} ({first_dtype}) first: FSDP raises '{INTEGER}'; 4-bit weights stored "
                       f"as uint8 need bnb_4bit_quant_storage set to the floating dtype of the other weights")
            hints = ("BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16) (the model's dtype)",)
            remedies = ()
        elif rest:
            other, other_dtype = rest[0]
            raised = f"{MIXED} but got torch.{first_dtype} and torch.{other_dtype}"
            message = f"{where} mixes {first_dtype} ({first}) and {other_dtype} ({other}): FSDP raises '{raised}'"
            quant = other_dtype not in FLOATING
            hints = (f"bnb_4bit_quant_storage=torch.{first_dtype}",) if quant else ()
            remedies = () if quant else (half_model_remedy(first_dtype, g.module or "model"),)
        else:
            continue
        named = [n for n, _ in g.flat[:2] if n in state]
        yield RULE.finding(
            message,
            module=g.module,
            module_type=trace.model.module_type(g.module),
            stage="model-loading",
            tensors=tuple(TensorMeta(state[n].dtype, state[n].device, state[n].shape, "weight", n, f"param:{n}") for n in named),
            pytorch_error=f"ValueError: {raised}",
            hints=hints,
            remedies=remedies,
        )


RULE = Rule(
    code="DD604",
    name="fsdp1-flatten-dtypes",
    severity="error",
    summary="An FSDP1 unit (use_orig_params=False) with mixed or integer parameter dtypes: FSDP(...) raises while wrapping.",
    why=(
        "FSDP1 flattens each unit's parameters into one FlatParameter, which has one floating dtype. A float32 head "
        "beside bf16 layers, or QLoRA's 4-bit weights stored as uint8 (bnb_4bit_quant_storage's default), stop the "
        "job at FSDP(...) on every rank."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))\n"
        "FSDP(model, use_orig_params=False)\n"
        "ValueError: Cannot flatten integer dtype tensors"
    ),
    fix="Store 4-bit weights in the model's dtype (bnb_4bit_quant_storage=torch.bfloat16), or load the whole model in one dtype.",
    fix_safety="display-only: the quantization config is in your loading code; half-model when no quantized weight is involved.",
    check=check,
    device_note="Judged from the units FSDP1's transformer auto-wrap policy forms over the model's _no_split_modules.",
)
