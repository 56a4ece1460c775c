"""What a quantized model is, read off its modules: bitsandbytes layers and peft adapters.

`quantization_of(model)` gives the `QuantizationInfo` record the report's header, the JSON's
`target.quantization` and the DD5xx rules read; None for a model with no bitsandbytes layer.
bitsandbytes and peft are never imported here: their layers are recognised by class name, so a
machine without them (or a model without them) pays nothing.
"""

from __future__ import annotations

from typing import Any

from dtype_doctor.records import AdapterInfo, QuantizationInfo, dtype_name

# bitsandbytes' quantized Linear classes (and peft's wrappers of them) by class name
LINEAR_4BIT = frozenset({"Linear4bit", "LinearNF4", "LinearFP4"})
LINEAR_8BIT = frozenset({"Linear8bitLt"})
# peft's LoRA weights: module names inside a tuner layer
ADAPTER_KINDS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


# Where a device map offloads a module (transformers' bitsandbytes quantizers check these names)
OFFLOADED = ("cpu", "disk")


def offloaded(device_map: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The modules a device map puts on cpu or disk."""
    return tuple(m for m, d in device_map if d in OFFLOADED)


def offload_refused(device_map: tuple[tuple[str, str], ...]) -> bool:
    """transformers' own condition for refusing a bitsandbytes model's device map without
    llm_int8_enable_fp32_cpu_offload (quantizer_bnb_8bit/4bit `validate_environment`): some
    module on cpu or disk, and the map is not all-cpu."""
    values = {d for _, d in device_map}
    return values != {"cpu"} and bool(values & set(OFFLOADED))


def is_quantized_linear(module_type: str) -> bool:
    return module_type in LINEAR_4BIT or module_type in LINEAR_8BIT


def quantization_of(model: Any) -> QuantizationInfo | None:
    """The QuantizationInfo of `model`, or None when it has no bitsandbytes layer."""
    four, eight = [], []
    for _name, mod in model.named_modules():
        kind = type(mod).__name__
        if not type(mod).__module__.startswith("bitsandbytes"):
            continue  # peft's LoRA wrappers share the class names; the layer they wrap is counted
        if kind in LINEAR_4BIT:
            four.append(mod)
        elif kind in LINEAR_8BIT:
            eight.append(mod)
    if not four and not eight:
        return None
    config = _config(model)
    adapters = _adapters(model)
    device_map = tuple((str(k), str(v)) for k, v in (getattr(model, "hf_device_map", None) or {}).items())
    offload = bool(getattr(config, "llm_int8_enable_fp32_cpu_offload", False))
    if four:
        first = four[0]
        state = getattr(first.weight, "quant_state", None)
        quant_type = getattr(state, "quant_type", None) or getattr(first.weight, "quant_type", None)
        compute = getattr(first, "compute_dtype", None)
        return QuantizationInfo(
            method="bitsandbytes-4bit",
            storage_dtype=dtype_name(first.weight.dtype),
            compute_dtype=dtype_name(compute) if compute is not None else None,
            quant_type=quant_type,
            layers=len(four),
            adapters=adapters,
            double_quant=getattr(state, "nested", False) is True,
            fp32_cpu_offload=offload,
            device_map=device_map,
        )
    return QuantizationInfo(
        method="bitsandbytes-8bit",
        storage_dtype=dtype_name(eight[0].weight.dtype),
        compute_dtype="float16",  # int8_vectorwise_quant casts the activations to float16
        quant_type="int8",
        layers=len(eight),
        adapters=adapters,
        fp32_cpu_offload=offload,
        device_map=device_map,
    )


def _config(model: Any) -> Any:
    """The model's quantization_config (transformers' BitsAndBytesConfig), through a peft wrapper too."""
    for m in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        cfg = getattr(getattr(m, "config", None), "quantization_config", None)
        if cfg is not None:
            return cfg
    return None


def _adapters(model: Any) -> tuple[AdapterInfo, ...]:
    """(kind, dtype) → count of the peft adapter weights in `model`."""
    seen: dict[tuple[str, str, bool], int] = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        kind = next((k for k in ADAPTER_KINDS if k in parts), None)
        if kind is None:
            continue
        key = (kind, dtype_name(p.dtype), bool(p.requires_grad))
        seen[key] = seen.get(key, 0) + 1
    return tuple(AdapterInfo(kind, dtype, n, trainable) for (kind, dtype, trainable), n in sorted(seen.items()))


# bitsandbytes' matmuls as the dispatcher names them ("bitsandbytes.gemm_4bit.default"):
# operand 0 is the activation, already cast to the layer's compute dtype
MATMUL_4BIT = frozenset({"bitsandbytes.gemm_4bit", "bitsandbytes.gemv_4bit"})


def bnb_op(op: str) -> str:
    """'bitsandbytes.gemm_4bit.default' → 'bitsandbytes.gemm_4bit' (other names unchanged)."""
    return ".".join(op.split(".")[:2]) if op.startswith("bitsandbytes.") else op
