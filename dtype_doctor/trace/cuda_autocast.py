"""CUDA autocast's policy, applied to a simulated CUDA trace on a CPU-only build of torch.

Such a build has no AutocastCUDA kernels, and CPU autocast's op lists differ from CUDA's
(CPU runs layer_norm, softmax and pow in the autocast dtype; CUDA runs them in float32).
So a simulated CUDA trace casts operands itself, per op, at the torch-function level —
above autograd, where autocast casts, so the backward sees the same casts. The lists are
CUDA's registrations in aten/src/ATen/autocast_mode.cpp (the "CUDA Ops that can autocast"
tables of PyTorch's AMP documentation), by the function names models call.
"""

from __future__ import annotations

from typing import Any

import torch

# lower_precision_fp: cast floating operands to the autocast dtype.
LOWER = frozenset(
    {
        "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "addr",
        "mv", "einsum", "chain_matmul", "multi_dot", "prelu", "conv1d", "conv2d", "conv3d", "conv_tbc",
        "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "lstm_cell", "gru_cell", "rnn_tanh_cell",
        "rnn_relu_cell", "scaled_dot_product_attention",
    }
)
# fp32 and fp32_set_opt_dtype: run in float32.
FP32 = frozenset(
    {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "__pow__", "softplus", "layer_norm", "group_norm", "cosine_similarity",
        "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss", "kl_div", "l1_loss",
        "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
        "pdist", "cdist", "renorm", "logsumexp", "prod", "softmax", "log_softmax", "cumprod", "cumsum",
        "vector_norm", "matrix_norm", "sum", "cross_entropy",
    }
)
# promote: cast to the widest floating dtype among the operands.
PROMOTE = frozenset({"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put", "index_put_", "tensordot", "scatter_add"})


class CudaAutocast:
    """Casts a function's operands as torch.autocast("cuda", dtype) would."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def cast(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        name = getattr(func, "__name__", "")
        if name in LOWER:
            return _map(args, kwargs, lambda t: t.to(self.dtype) if _eligible(t) else t)
        if name in FP32:
            return _map(args, kwargs, lambda t: t.float() if _eligible(t) else t)
        if name in PROMOTE:
            floats = [t for t in _tensors(args, kwargs) if _eligible(t) or t.dtype == torch.float64]
            if len({t.dtype for t in floats}) > 1:
                widest = max((t.dtype for t in floats), key=lambda d: torch.finfo(d).bits)
                return _map(args, kwargs, lambda t: t.to(widest) if t.is_floating_point() else t)
        return args, kwargs


def _eligible(t: torch.Tensor) -> bool:
    """Autocast casts floating tensors other than float64 (CUDA's own rule)."""
    return t.is_floating_point() and t.dtype != torch.float64


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _map(args: tuple, kwargs: dict, f: Any) -> tuple[tuple, dict]:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return f(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(one(x) for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}
