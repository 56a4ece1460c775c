"""CUDA autocast's policy, applied to a simulated CUDA trace on a CPU-only build of torch.

Such a build has no AutocastCUDA kernels, and CPU autocast's op lists differ from CUDA's
(CPU runs layer_norm, softmax and pow in the autocast dtype, and binary_cross_entropy in
float32; CUDA runs the first in float32 and refuses the last). So a simulated CUDA trace
casts operands itself, per function, at the torch-function level — above autograd, where
autocast casts, so the backward sees the same casts. The recorder's function mode opens
torch's Python-level functions (F.multi_head_attention_forward, F.softmax, torch.einsum …)
while this policy is on, so the functions they call are cast too, as CUDA autocast casts
every aten op whatever Python called it.

The lists are CUDA's registrations in aten/src/ATen/autocast_mode.cpp (the macros
AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE
of ATen/autocast_mode.h in torch 2.13, and the banned binary_cross_entropy), plus cuDNN's RNN
wrapper (aten/src/ATen/cudnn/AutocastRNN.cpp: input, weights and states go to float16), by
the names models call them.

The policy is CUDA autocast's own thread-local state (`torch.set_autocast_enabled("cuda")`),
so `torch.autocast("cuda", enabled=False)` inside the model turns it off for its block, and
`torch._C._is_any_autocast_enabled()` answers as on a GPU (nn.RNNBase skips its input-dtype
check under autocast). Not followed: a region keyed on a tensor's device type
(`torch.autocast(x.device.type, …)`) when simulated tensors live on `meta`, and a region the
model enables itself (`torch.autocast("cuda")` turns itself off on a build without CUDA).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from dtype_doctor.machine.modes import tensors_in

# lower_precision_fp: cast eligible operands to the autocast dtype.
LOWER = frozenset(
    {
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__",
        "einsum", "mm", "mv", "linalg_vecdot", "vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
        "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    }
)
# cuDNN's RNN wrapper casts input, weights and states to float16 whatever the autocast dtype.
RNN = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})
# fp32, fp32_set_opt_dtype and fp32_append_dtype: run in float32.
FP32 = frozenset(
    {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "native_layer_norm", "rms_norm",
        "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
        "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
        "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
        "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
        "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
        "upsample_bicubic2d", "_upsample_bicubic2d_aa",
        # fp32_set_opt_dtype
        "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "vector_norm",
        "linalg_matrix_norm", "matrix_norm", "sum",
        # fp32_append_dtype
        "norm",
        # a composite of log_softmax and nll_loss (both fp32) that the function level sees whole
        "cross_entropy", "cross_entropy_loss",
    }
)
# promote: float32 when an eligible operand is float32, else the autocast dtype; float64 stays.
PROMOTE = frozenset(
    {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "grid_sample", "index_put",
     "tensordot", "scatter_add"}
)
# Registered to raise under CUDA autocast (autocast_mode.cpp: binary_cross_entropy_banned).
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. Many models use a "
        "sigmoid layer right before the binary cross entropy layer. In this case, combine the two layers using "
        "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss.  "
        "binary_cross_entropy_with_logits and BCEWithLogits are safe to autocast."
    ),
}


class CudaAutocast:
    """Casts a function's operands as torch.autocast("cuda", dtype) would.

    A context manager: inside it CUDA autocast's thread-local state says "enabled, dtype",
    which model code reads and changes as on a GPU.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._saved: list[tuple[bool, torch.dtype]] = []

    def __enter__(self) -> "CudaAutocast":
        self._saved.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")))
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)
        return self

    def __exit__(self, *exc: Any) -> None:
        enabled, dtype = self._saved.pop()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", dtype)

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        saved = torch.is_autocast_enabled("cuda")
        torch.set_autocast_enabled("cuda", False)
        try:
            yield
        finally:
            torch.set_autocast_enabled("cuda", saved)

    @property
    def enabled(self) -> bool:
        return torch.is_autocast_enabled("cuda")

    def current(self) -> str | None:
        """The autocast dtype in force here ("float16"), or None in a disabled region."""
        return str(torch.get_autocast_dtype("cuda")).removeprefix("torch.") if self.enabled else None

    def refusal(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        """CUDA autocast's own error for this call, when it refuses to run it at all: a banned
        function, or a promote op given two different half dtypes (at::autocast::prioritize)."""
        if not self.enabled:
            return None
        name = getattr(func, "__name__", "")
        if name in BANNED:
            return BANNED[name]
        if name in PROMOTE:
            lower, current = torch.get_autocast_dtype("cuda"), torch.get_autocast_dtype("cuda")
            for t in tensors_in(args, kwargs):
                if not _eligible(t):
                    continue
                if current == torch.float32 or t.dtype == torch.float32:
                    current = torch.float32
                elif t.dtype != lower:
                    return "Unexpected floating ScalarType in at::autocast::prioritize"
        return None

    def cast(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not self.enabled:
            return args, kwargs
        name = getattr(func, "__name__", "")
        if name in LOWER:
            dtype = torch.get_autocast_dtype("cuda")
            return _map(args, kwargs, lambda t: t.to(dtype) if _eligible(t) and t.dtype != dtype else t)
        if name in RNN:
            return _map(args, kwargs, lambda t: t.half() if _eligible(t) and t.dtype != torch.float16 else t)
        if name in FP32:
            return to_float32(args, kwargs)
        if name in PROMOTE:
            eligible = {t.dtype for t in tensors_in(args, kwargs) if _eligible(t)}
            if len(eligible) > 1 or (eligible and torch.float32 not in eligible):
                to = torch.float32 if torch.float32 in eligible else torch.get_autocast_dtype("cuda")
                return _map(args, kwargs, lambda t: t.to(to) if _eligible(t) and t.dtype != to else t)
        return args, kwargs


def to_float32(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return _map(args, kwargs, lambda t: t.float() if _eligible(t) and t.dtype != torch.float32 else t)


def _eligible(t: torch.Tensor) -> bool:
    """CUDA autocast casts floating CUDA tensors other than float64 (at::autocast::is_eligible):
    a tensor left on the CPU (made in forward without device=) keeps its dtype."""
    return t.is_floating_point() and t.dtype != torch.float64 and t.device.type != "cpu"


def _map(args: tuple, kwargs: dict, f: Any) -> tuple[tuple, dict]:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return f(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(one(x) for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}
