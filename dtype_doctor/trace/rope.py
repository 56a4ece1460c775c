"""What a half-precision copy of a rotary embedding's frequencies does at the model's longest position.

RoPE turns position p into the angles p * f_i. transformers computes f_i (`inv_freq`) in float32 at
init and keeps it in a buffer; `model.to(torch.bfloat16)` rounds that buffer, and every angle then
carries p * |bf16(f_i) - f_i|: an error that grows with the position. Measured for Llama's default
RoPE (theta 10000), the largest angle error at position 4095 is 1.79 rad for head_dim 64 and 5.0 rad
for head_dim 128 (cos off by up to 0.59 and 1.68); sgl-project/sglang-jax#1473 reports the same
mechanism at position 4095 as a largest output difference of 0.828 (head_dim 128).

The bound (DD109's POSITION_BOUND): rounding f_i by a relative error e shifts position p's angle by the angle of p * e
positions. A buffer fails it when, at the model's longest position, some frequency's angle is off by
half a position or more (p * e >= 0.5): from there on neighbouring positions can no longer be told
apart at that frequency. bfloat16 rounds by up to 2**-8 (8 significant bits), so it can fail from
position 128 on; float16 (2**-11) from 1024, or earlier where its range flushes small frequencies.
Measured for head_dim 128 at position 4095: 5.0 rad, 15 positions (bf16); 0.99 rad, 1.7 positions (fp16).

The reference frequencies come from the module's own init function and config (transformers'
rope types included), so no buffer value is read: a simulated (fake) model is judged the same.
"""

from __future__ import annotations

from typing import Any

import torch

from dtype_doctor.records import RotaryFacts

HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def reference_inv_freq(module: torch.nn.Module) -> torch.Tensor | None:
    """The float32 frequencies a transformers rotary module computes at init, recomputed from its config."""
    config = getattr(module, "config", None)
    rope_type = getattr(module, "rope_type", None)
    if config is None or rope_type is None:
        return None
    if rope_type == "default" and hasattr(module, "compute_default_rope_parameters"):
        init = module.compute_default_rope_parameters
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        init = ROPE_INIT_FUNCTIONS.get(rope_type)
        if init is None:
            return None
    with torch.device("cpu"):
        out = init(config)
    inv = out[0] if isinstance(out, tuple) else out
    return inv.detach().to("cpu", torch.float32) if isinstance(inv, torch.Tensor) else None


def phase_error(inv: torch.Tensor, position: int, dtype: torch.dtype) -> tuple[float, float]:
    """(largest angle error in radians, that error in positions) at `position` for `inv` held in `dtype`."""
    rounded = inv.to(dtype).to(torch.float32)
    delta = (rounded - inv).abs()
    radians = float((delta * position).max())
    positions = float((delta / inv.clamp_min(torch.finfo(torch.float32).tiny) * position).max())
    return radians, positions


def rotary_facts(model: torch.nn.Module, buffers: dict[str, Any]) -> tuple[RotaryFacts, ...]:
    """The rotary modules whose inv_freq buffer is half precision, with the error that costs at their longest position."""
    found = []
    for name, mod in model.named_modules():
        key = f"{name}.inv_freq" if name else "inv_freq"
        buf = buffers.get(key)
        if buf is None or buf.dtype not in HALF_DTYPES.values():
            continue
        try:
            with torch._C._DisableTorchDispatch(), torch._subclasses.fake_tensor.unset_fake_temporarily():
                inv = reference_inv_freq(mod)
                longest = int(getattr(mod, "original_max_seq_len", 0) or getattr(mod.config, "max_position_embeddings", 0))
                if inv is None or longest < 2:
                    continue
                error = tuple((d, *phase_error(inv, longest - 1, t)) for d, t in HALF_DTYPES.items())
        except Exception:  # noqa: BLE001 - an init function this version cannot run: judged by name alone
            continue
        found.append(RotaryFacts(name, longest, 2 * inv.numel(), str(getattr(mod, "rope_type", "default")), error))
    return tuple(found)
