"""A simulated CUDA step runs scaled_dot_product_attention on the kernel the GPU picks.

A CPU-only build has no fused SDPA kernel for CUDA, so on the simulated GPU's stand-ins torch's
composite takes the math fallback: about thirty matmul, softmax, cast and view ops a layer where
the GPU runs one flash or memory-efficient kernel. Here the backend is chosen as torch's CUDA
dispatcher chooses it (ops/sdpa.py, select_sdp_backend in sdp_utils.cpp) and the call is run as
torch's composite runs it for that backend (scaled_dot_product_attention in
aten/src/ATen/native/transformers/attention.cpp):

- flash: query, key and value padded to a head dim that is a multiple of 8 (the scale taken from
  the head dim before padding), `_scaled_dot_product_flash_attention`, the output sliced back;
- memory-efficient: a bool mask made additive in the query's dtype, a mask whose strides are not
  8-aligned padded to 8 and sliced back, expanded to (batch, heads, L, S);
  `_scaled_dot_product_efficient_attention`, log-sum-exp kept when autograd will need it;
- math: torch's own composite, as before. So is a memory-efficient call with grouped-query heads
  (fewer key/value heads than query heads) that autograd will differentiate: the meta backward of
  that kernel gives key and value gradients with the query's head count
  (torch/_meta_registrations.py), which autograd refuses. Without gradients (generate, evaluation)
  it runs the kernel.

A backend the script turned off (`torch.backends.cuda.enable_flash_sdp(False)`,
`torch.nn.attention.sdpa_kernel`) is not chosen, as on the GPU.

The fused kernels' meta functions give the GPU's output dtypes and shapes, and their backward is
the fused backward a GPU runs. The verdict on the call (the kernel probe, the rules' backend row)
is unchanged: this is how the stand-ins run, not what is said of them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from dtype_doctor.ops.sdpa import SdpaCall, cuda_backend
from dtype_doctor.records import TensorMeta, dtype_name

_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
_MASK_ALIGN = 8  # attention.cpp preprocess_mask: mem_eff_alignment
_HEAD_ALIGN = 8  # attention.cpp pad_last_dim<8, false>: FlashAttention-2's head dims
_SIMULATED_GPU = ("meta", "cuda")  # where a simulated GPU's tensors live (machine/home.py)


def _bound(args: tuple, kwargs: dict) -> dict[str, Any] | None:
    if len(args) > len(_ARGS) or any(k not in _ARGS for k in kwargs):
        return None
    bound = {**_DEFAULTS, **dict(zip(_ARGS, args)), **kwargs}
    return bound if all(k in bound for k in ("query", "key", "value")) else None


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(dtype_name(t.dtype), "cuda", tuple(t.shape))


def fused_run(args: tuple, kwargs: dict, capability: tuple[int, int]) -> Callable[[tuple, dict], Any] | None:
    """How the GPU of `capability` runs this SDPA call, as a recorder `run`; None: the math fallback
    (torch's composite, run as it is)."""
    b = _bound(args, kwargs)
    if b is None:
        return None
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    tensors = (q, k, v) if mask is None else (q, k, v, mask)
    if not all(isinstance(t, torch.Tensor) and not t.is_nested and t.layout == torch.strided for t in tensors):
        return None
    if len({t.device for t in tensors}) > 1 or q.device.type not in _SIMULATED_GPU:
        return None  # a module the script left on the CPU runs the CPU's SDPA; a device mix, torch's own checks
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    call = SdpaCall(_meta(q), _meta(k), _meta(v), None if mask is None else _meta(mask), float(b["dropout_p"]),
                    bool(b["is_causal"]), bool(b["enable_gqa"]), grad)
    backend = cuda_backend(call, capability, _enabled()).backend
    if backend == "flash":
        return lambda a, kw: _flash(_bound(a, kw))
    if backend == "efficient" and (not grad or q.shape[-3] == k.shape[-3] == v.shape[-3]):
        return lambda a, kw: _efficient(_bound(a, kw))
    return None


def _enabled() -> tuple[str, ...]:
    """The fused backends the script left on (torch.backends.cuda's flags, which sdpa_kernel sets)."""
    cuda = torch.backends.cuda
    return tuple(name for name, on in (("flash", cuda.flash_sdp_enabled()), ("efficient", cuda.mem_efficient_sdp_enabled())) if on)


def _flash(b: dict[str, Any]) -> torch.Tensor:
    q, k, v = b["query"], b["key"], b["value"]
    head = q.shape[-1]
    scale = b["scale"] if b["scale"] is not None else 1.0 / math.sqrt(head)
    pad = (-head) % _HEAD_ALIGN
    if pad:
        q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, float(b["dropout_p"]), bool(b["is_causal"]),
                                                            False, scale=scale)[0]
    return out[..., :head] if pad else out


def _efficient(b: dict[str, Any]) -> torch.Tensor:
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    if mask is not None:
        if mask.dtype == torch.bool:
            mask = torch.where(mask.logical_not(), -65504.0, torch.zeros((), dtype=q.dtype, device=q.device))
        if not _aligned(mask):
            size = mask.shape[-1]
            mask = torch.nn.functional.pad(mask, (0, _MASK_ALIGN - size % _MASK_ALIGN))[..., :size]
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, lse, float(b["dropout_p"]),
                                                                  bool(b["is_causal"]), scale=b["scale"])[0]


def _aligned(mask: torch.Tensor) -> bool:
    """attention.cpp aligned_tensor<8>: every stride but the last a multiple of 8, the last 1."""
    return all(s % _MASK_ALIGN == 0 for s in mask.stride()[:-1]) and mask.stride()[-1] == 1
