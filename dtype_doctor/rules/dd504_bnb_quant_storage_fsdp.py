"""DD504: 4-bit weights stored as integers beside floating parameters, or 8-bit (int8) weights: FSDP cannot flatten them."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOATING, Finding, Remedy, TensorMeta, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    q = trace.model.quantization
    if q is not None and q.method == "bitsandbytes-8bit":
        yield from _int8(trace)
        return
    if q is None or q.method != "bitsandbytes-4bit" or q.storage_dtype in FLOATING:
        return
    params = trace.model.parameters
    floating = [p for p in params if p.dtype in FLOATING]
    packed = [p for p in params if p.dtype == q.storage_dtype]
    main = trace.model.main_dtype
    if not floating or not packed or main is None:
        return
    first = packed[0]
    yield RULE.finding(
        f"{len(packed)} 4-bit weights are stored as {q.storage_dtype} beside {len(floating)} {main} parameters: FSDP flattens "
        f"each unit's parameters into one tensor and refuses (\"Must flatten tensors with uniform dtype but got torch.{main} and "
        f"torch.{q.storage_dtype}\", or \"Cannot flatten integer dtype tensors\"); set bnb_4bit_quant_storage=torch.{main}",
        module=first.name.rsplit(".", 1)[0],
        module_type=trace.model.module_type(first.name.rsplit(".", 1)[0]),
        stage="model-loading",
        tensors=(TensorMeta(first.dtype, first.device, first.shape, "weight", first.name, f"param:{first.name}"),),
        remedies=(Remedy("bnb-quant-storage", "model", main, "model-loading"),),
    )


def _int8(trace: Trace) -> Iterator[Finding]:
    """8-bit weights are int8 with no storage option: FSDP1 refuses them beside floating parameters
    ("Must flatten tensors with uniform dtype") and alone ("Cannot flatten integer dtype tensors")."""
    packed = [p for p in trace.model.parameters if p.dtype == "int8"]
    if not packed or (trace.world is not None and trace.world.strategy == "fsdp2"):
        return  # fully_shard (FSDP2) shards each parameter as it is: int8 beside bf16 goes through
    first = packed[0]
    module = first.name.rsplit(".", 1)[0]
    yield RULE.finding(
        f"{len(packed)} 8-bit weights are stored as int8: FSDP1 (FullyShardedDataParallel) cannot flatten integer tensors (\"Cannot flatten integer "
        "dtype tensors\", or \"Must flatten tensors with uniform dtype\" beside floating ones), and 8-bit has no "
        "storage option (bnb_4bit_quant_storage is 4-bit's); a model wrapped in FullyShardedDataParallel needs the 4-bit quantization",
        module=module,
        module_type=trace.model.module_type(module),
        stage="model-loading",
        tensors=(TensorMeta(first.dtype, first.device, first.shape, "weight", first.name, f"param:{first.name}"),),
        hints=("or load in 4 bits with bnb_4bit_quant_storage set to the model's dtype (BitsAndBytesConfig(load_in_4bit=True, "
               "bnb_4bit_quant_storage=torch.bfloat16)), which FSDP flattens",),
    )


RULE = Rule(
    code="DD504",
    name="bnb-quant-storage-fsdp",
    severity="info",
    summary="4-bit weights stored as uint8 (bnb_4bit_quant_storage's default) beside floating parameters, or 8-bit weights (int8, no storage option): FSDP cannot shard the model.",
    why=(
        "FSDP (FullyShardedDataParallel) flattens every unit's parameters into one FlatParameter of one dtype. "
        "bitsandbytes packs 4-bit weights into uint8 by default, so a QLoRA model wrapped in FSDP fails at wrapping. "
        "bnb_4bit_quant_storage=torch.bfloat16 packs the same bits into bfloat16 storage FSDP can flatten. "
        "8-bit weights are int8 and have no such option: FSDP refuses them even alone (\"Cannot flatten integer dtype tensors\"). "
        "An info, because a single-process trace cannot see whether FSDP will wrap the model."
    ),
    example=(
        "model = nn.Sequential(nn.Linear(64, 64).bfloat16(), bnb.nn.Linear4bit(64, 64).to('cpu'))\n"
        "FSDP(model, device_id=torch.device('cpu'))\n"
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.uint8"
    ),
    fix="BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16) — the dtype of the other parameters.",
    fix_safety="Safe: the same 4-bit values, stored in a floating container.",
    check=check,
    references=("https://huggingface.co/docs/peft/accelerate/fsdp#use-peft-qlora-and-fsdp-for-finetuning-large-models-on-multiple-gpus",),
    device_note="The same on every device: the check is FSDP's (torch/distributed/fsdp/_flat_param.py).",
)
