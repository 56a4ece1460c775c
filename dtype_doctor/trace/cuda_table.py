"""The CPU↔CUDA table: where a CPU kernel's verdict on dtypes is not the CUDA kernel's.

A simulated CUDA trace asks the real CPU kernel (trace/probe.py). Its verdict carries over
to CUDA except in these documented cases, each grounded in PyTorch itself:

| case | CPU | CUDA | grounding |
|---|---|---|---|
| an op whose dtype lists differ (93 ops in torch 2.13: integer mm/addmm/bmm/linear/dot, integer max/avg pooling, half avg_pool3d, half multi_margin_loss, …) | its CPU list | its CUDA list | `dtypes` / `dtypesIfCUDA` of the op's OpInfo in PyTorch's op database, shipped as dtype_doctor/data/op_dtypes.json by scripts/gen_op_dtypes.py |
| bfloat16 matmul-family ops listed for CPU only | runs | runs from compute capability 8.0 (Ampere) | op_db gates bf16 on `SM53OrLater`/`SM80OrLater`; `torch.cuda.is_bf16_supported()` |
| bfloat16 matmul, conv or attention on a GPU before compute capability 8.0 (`--gpu t4`, `v100`) | runs | refused (DD107) | cuBLAS/cuDNN bf16 tensor-core kernels need sm_80 |
| GradScaler unscaling bfloat16 gradients (DD401) | runs | refused: `_amp_foreach_non_finite_check_and_unscale_cuda` not implemented for 'BFloat16' | the CUDA kernel's dispatch covers float and half only |
| conv with a bias of another dtype than input and weight | the slow path runs it (no oneDNN) | cuDNN refuses: "Input type … and bias type … should be the same" | `check_input_same_type_as_parameters` runs for the cuDNN/MIOpen/oneDNN backends only (aten/src/ATen/native/Convolution.cpp) |

| layer_norm, softmax, pow, losses … under float16/bfloat16 autocast | run in the autocast dtype | run in float32 | CUDA's autocast lists (trace/cuda_autocast.py), applied to simulated CUDA traces |

Anything not in this table is assumed to behave on CUDA as on this CPU.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from dtype_doctor.records import TensorMeta
from dtype_doctor.trace.gpus import GpuProfile

TENSOR_CORE_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution",
     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math"}
)
_CONV = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
_GATED_BF16 = "bfloat16"  # op_db lists it for CUDA only on capable GPUs


@lru_cache(maxsize=1)
def op_dtypes() -> dict[str, dict[str, frozenset[str]]]:
    text = resources.files("dtype_doctor.data").joinpath("op_dtypes.json").read_text()
    return {k: {dev: frozenset(v) for dev, v in lists.items()} for k, lists in json.loads(text)["ops"].items()}


def _lists(op: str) -> dict[str, frozenset[str]] | None:
    name = op.removeprefix("aten.").split(".")[0]
    table = op_dtypes()
    bare = name.lstrip("_").removeprefix("native_").rstrip("_")
    for key in (name, bare, bare.removesuffix("_forward"), bare.removesuffix("_with_indices"), bare.removesuffix("_out_frame")):
        if key in table:
            return table[key]
    return None


def on_cuda(op: str, operands: tuple[TensorMeta, ...], cpu_error: str | None, unsupported: str | None, gpu: GpuProfile | None) -> str | None:
    """The CUDA verdict (None: accepted; else the reason) from the CPU probe's verdict.

    `unsupported` is the dtype the CPU kernel lacks, when that was the CPU's reason.
    """
    name = op.removeprefix("aten.").split(".")[0]
    data = [t for t in operands if not t.is_scalar and t.role not in ("index", "mask")]
    lists = _lists(op)
    capable = gpu is None or gpu.bf16
    if gpu is not None and not gpu.bf16 and name in TENSOR_CORE_OPS and any(t.dtype == "bfloat16" for t in data):
        return f"{name} has no CUDA kernel for bfloat16 on {gpu} (bf16 needs compute capability 8.0)"
    if cpu_error is not None:
        if unsupported and lists is not None and unsupported in lists["cuda"]:
            return None  # CUDA implements what this CPU lacks
        return cpu_error
    if lists is not None and data:
        # An op's dtype lists are for its first tensor (OpInfo's sample input).
        for t in data[:1]:
            cuda_ok = t.dtype in lists["cuda"] or (t.dtype == _GATED_BF16 and t.dtype in lists["cpu"] and capable)
            if t.dtype in lists["cpu"] and not cuda_ok:
                return f'"{name}" has no CUDA kernel for {t.dtype} (PyTorch op database: CUDA supports {", ".join(sorted(lists["cuda"] - {"complex32"}))})'
    if name in _CONV:
        x = [t for t in operands if t.role not in ("bias",) and not t.is_scalar]
        bias = [t for t in operands if t.role == "bias"]
        if bias and x and bias[0].dtype != x[0].dtype:
            return f"Input type ({x[0].dtype}) and bias type ({bias[0].dtype}) should be the same (cuDNN checks the bias; this CPU's slow path does not)"
    return None
