"""compare's quantized rows: a copy of the user's fp32 model with its Linear layers quantized by
bitsandbytes, as `from_pretrained(quantization_config=BitsAndBytesConfig(...))` would quantize them.

The layers transformers leaves out (the output head and what is tied to it,
`transformers.quantizers.base.get_keys_to_not_convert`) stay float32; every other `nn.Linear`
becomes a `bnb.nn.Linear8bitLt` (LLM.int8, threshold 6.0) or `bnb.nn.Linear4bit` (nf4 or fp4,
computing in float32, the reference's dtype), its weights quantized as they move to the device.
Weight memory counts the packed weights (uint8/int8 parameters), not bitsandbytes' per-block
scales (its quant_state, which is no parameter).
"""

from __future__ import annotations

import copy
import torch

from dtype_doctor.records import in_modules


def _not_converted(model: torch.nn.Module) -> tuple[str, ...]:
    try:
        from transformers.quantizers.base import get_keys_to_not_convert

        return tuple(get_keys_to_not_convert(model))
    except Exception:  # noqa: BLE001 - not a transformers model: every Linear is converted
        return ()


def _quantized(linear: torch.nn.Linear, kind: str, device: torch.device) -> torch.nn.Module:
    import bitsandbytes as bnb

    bias = linear.bias is not None
    weight = linear.weight.detach().float().cpu().clone()
    if kind == "int8":
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=bias, has_fp16_weights=False, threshold=6.0)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=bias, compute_dtype=torch.float32, quant_type=kind)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=kind)
    if bias:
        layer.bias = torch.nn.Parameter(linear.bias.detach().float().cpu().clone(), requires_grad=linear.bias.requires_grad)
    return layer.to(device)  # bitsandbytes quantizes as the weights land on the device


def quantize_copy(model: torch.nn.Module, kind: str, device: torch.device) -> tuple[torch.nn.Module, str]:
    """(a quantized copy of `model`, a note saying how many layers were quantized and which were kept)."""
    model = copy.deepcopy(model)
    skip = _not_converted(model)
    done = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if type(child) is torch.nn.Linear and not in_modules(skip, full):
                setattr(parent, name, _quantized(child, kind, device))
                done += 1
    if not done:
        raise ValueError("the model has no nn.Linear layer bitsandbytes can quantize")
    what = {"int8": "int8 (LLM.int8, activations quantized through float16)", "nf4": "4-bit nf4, computing in float32",
            "fp4": "4-bit fp4, computing in float32"}[kind]
    kept = f"; {', '.join(skip)} kept float32" if skip else ""
    return model, f"{done} Linear layers {what}{kept}"
