"""`xformers` under `--simulate`, as the target machine has it installed (version 0.0.35, version.txt).

diffusers finds it at import (`_xformers_available`, utils/import_utils.py:225) and, for
`enable_xformers_memory_efficient_attention()`, runs `xformers.ops.memory_efficient_attention` once on a
CUDA tensor (models/attention_processor.py:424-425) before swapping in its xFormers processors.

`memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None)` runs what xFormers'
CUTLASS operator runs: `aten._efficient_attention_forward`, torch's copy of the same kernel, with its
backward (facebookresearch/xformers at ce4f89d, xformers/ops/fmha/cutlass.py:165-193), after the checks
its dispatch makes, in their words:
- Inputs.validate_inputs (fmha/common.py:208-247): q/k/v on one device and of one dtype;
- AttentionOpBase.not_supported_reasons (common.py:436-500): device `cuda`, compute capability 5.0 and
  up, dtype float32/float16/bfloat16 (cutlass.py:172), bfloat16 only from capability 8.0 ("bf16 is only
  supported on A100+ GPUs"), head dim at most 65536 (cutlass.py:173); none fitting is
  dispatch.py:74-81's NotImplementedError "No operator found for `memory_efficient_attention_forward`".
Biases: none, a tensor, or the causal masks (`LowerTriangularMask`, `LowerTriangularFromBottomRightMask`);
the block-diagonal and paged biases need xFormers' own kernels and are refused as not simulated.
"""

from __future__ import annotations

from typing import Any

from dtype_doctor.machine.fake_package import FakePackage, Refuse

VERSION = "0.0.35"
MIN_CAPABILITY = (5, 0)  # fmha/common.py:391 CUDA_MINIMUM_COMPUTE_CAPABILITY
MAX_K = 65536  # fmha/cutlass.py:173 SUPPORTED_MAX_K
NAME = "cutlassF-pt"  # fmha/cutlass.py:193


class AttentionBias:
    """fmha/attn_bias.py AttentionBias."""


class LowerTriangularMask(AttentionBias):
    """Causal, from the top left (custom_mask_type 1 of the kernel)."""


class LowerTriangularFromBottomRightMask(AttentionBias):
    """Causal, from the bottom right (custom_mask_type 2)."""


class AttentionOpBase:
    """fmha/common.py AttentionOpBase: what diffusers' processors take as `attention_op`."""

    NAME = NAME
    SUPPORTED_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def _reasons(q: Any) -> list[str]:
    import torch

    reasons = []
    dtype = q.dtype
    on_gpu = q.device.type != "cpu"  # the simulated GPU's tensors live on the stand-in device (machine/home.py)
    capability = torch.cuda.get_device_capability() if on_gpu else None
    if not on_gpu:
        reasons.append("device=cpu (supported: {'cuda'})")
    elif capability < MIN_CAPABILITY:  # type: ignore[operator]
        reasons.append(f"requires device with capability >= {MIN_CAPABILITY} but your GPU has capability {capability} (too old)")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        reasons.append(f"dtype={dtype} (supported: {{torch.float32, torch.float16, torch.bfloat16}})")
    if dtype is torch.bfloat16 and (capability is None or capability[0] < 8):
        reasons.append("bf16 is only supported on A100+ GPUs")
    if q.shape[-1] > MAX_K:
        reasons.append(f"max(query.shape[-1], value.shape[-1]) > {MAX_K}")
    return reasons


def _validate(q: Any, k: Any, v: Any) -> None:
    if any(x.device != q.device for x in (k, v)):
        raise ValueError("Query/Key/Value should all be on the same device")
    if not all(x.dtype == q.dtype for x in (k, v)):
        raise ValueError("Query/Key/Value should either all have the same dtype, or (in the quantized case) Key/Value "
                         f"should have dtype torch.int32\n  query.dtype: {q.dtype}\n  key.dtype  : {k.dtype}\n"
                         f"  value.dtype: {v.dtype}")


def _attention(refuse: Refuse) -> Any:
    def memory_efficient_attention(query: Any, key: Any, value: Any, attn_bias: Any = None, p: float = 0.0,
                                   scale: float | None = None, *, op: Any = None, output_dtype: Any = None) -> Any:
        """fmha/__init__.py memory_efficient_attention: [B, M, H, K] (or [B, M, K]) in, the same layout out."""
        import torch

        if attn_bias is not None and not isinstance(attn_bias, (torch.Tensor, LowerTriangularMask, LowerTriangularFromBottomRightMask)):
            return refuse(f"xformers.ops.memory_efficient_attention with {type(attn_bias).__name__}")()
        three = query.ndim == 3
        q, k, v = (x.unsqueeze(2) if three else x for x in (query, key, value))
        _validate(q, k, v)
        reasons = _reasons(q)
        if reasons:
            raise NotImplementedError(f"No operator found for `memory_efficient_attention_forward` with inputs:\n"
                                      f"     query : shape={tuple(q.shape)} ({q.dtype})\n"
                                      f"`{NAME}` is not supported because:\n    " + "\n    ".join(reasons))
        mask = 1 if isinstance(attn_bias, LowerTriangularMask) else 2 if isinstance(attn_bias, LowerTriangularFromBottomRightMask) else 0
        bias = attn_bias if isinstance(attn_bias, torch.Tensor) else None
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        out = torch.ops.aten._efficient_attention_forward(q, k, v, bias, None, None, None, None, float(p), mask, grad,
                                                          scale=scale)[0]
        return out.squeeze(2) if three else out

    return memory_efficient_attention


def _modules(refuse: Refuse) -> dict[str, dict[str, Any]]:
    attention = _attention(refuse)
    biases = {"AttentionBias": AttentionBias, "LowerTriangularMask": LowerTriangularMask,
              "LowerTriangularFromBottomRightMask": LowerTriangularFromBottomRightMask}
    ops = {"memory_efficient_attention": attention, "AttentionOpBase": AttentionOpBase, **biases}
    return {"xformers": {"__version__": VERSION}, "xformers.ops": ops, "xformers.ops.fmha": dict(ops),
            "xformers.ops.fmha.attn_bias": biases}


XFORMERS = FakePackage("xformers", "xformers", VERSION, _modules, refuses_rest=True)
