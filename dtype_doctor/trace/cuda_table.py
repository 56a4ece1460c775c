"""The CPU↔CUDA table: where a CPU kernel's verdict on dtypes is not the CUDA kernel's.

A simulated CUDA trace asks the real CPU kernel (trace/probe.py). Its verdict carries over
to CUDA except in these documented cases, each grounded in PyTorch itself:

| case | CPU | CUDA | grounding |
|---|---|---|---|
| an op whose dtype lists differ (93 ops in torch 2.13: integer mm/addmm/bmm/linear/dot, integer max/avg pooling, half avg_pool3d, half multi_margin_loss, …) | its CPU list | its CUDA list | `dtypes` / `dtypesIfCUDA` of the op's OpInfo in PyTorch's op database, shipped as dtype_doctor/data/op_dtypes.json by scripts/gen_op_dtypes.py |
| a CUDA dtype op_db gates on the GPU's compute capability (`--gpu`): bfloat16 matmul/bmm/addbmm/bilinear need 5.3, bfloat16 `_flash_attention_forward` / `_efficient_attention_forward` need 8.0 | runs | refused below that capability (DD107 error) | `SM53OrLater` / `SM80OrLater` in the OpInfos' `dtypesIfCUDA`, read per capability by the generator ("cuda_needs") |
| bfloat16 matmul, linear, conv or attention on a GPU before compute capability 8.0 (`--gpu t4`, `v100`) | runs | runs, without bf16 tensor cores: slow (DD107 warning) | op_db lists bf16 mm/addmm/linear for CUDA unconditionally and matmul/bmm from sm_53; pytorch/pytorch#124996 (bf16 matmul runs on a V100); cuDNN is skipped for bf16 conv before sm_80 (`supportsBFloat16ConvolutionWithCuDNNv8`) and the native CUDA conv runs it; SDPA falls back from flash/efficient to the math kernel; `torch.cuda.is_bf16_supported(including_emulation=False)` is False there |
| GradScaler unscaling bfloat16 gradients (DD401) | runs | refused: `_amp_foreach_non_finite_check_and_unscale_cuda` not implemented for 'BFloat16' | the CUDA kernel's dispatch covers float and half only |
| conv with a bias of another dtype than input and weight | the slow path runs it (no oneDNN) | cuDNN refuses: "Input type … and bias type … should be the same" | `check_input_same_type_as_parameters` runs for the cuDNN/MIOpen/oneDNN backends only (aten/src/ATen/native/Convolution.cpp) |
| integer `F.max_pool1d` | refused: the mode-free CPU path (`max_pool1d_impl`) has floating kernels only; with `return_indices=True` (`max_pool2d_with_indices`) it runs | refused either way: CUDA always takes `max_pool2d_with_indices`, floating only | aten/src/ATen/native/MaxPooling.cpp; op_db's max_pool2d lists |
| layer_norm, softmax, pow, losses … under float16/bfloat16 autocast | run in the autocast dtype | run in float32 | CUDA's autocast lists (trace/cuda_autocast.py), applied to simulated CUDA traces |
| binary_cross_entropy under autocast | runs in float32 | refused: "unsafe to autocast" | autocast_mode.cpp registers `binary_cross_entropy_banned` for CUDA only |

Anything not in this table is assumed to behave on CUDA as on this CPU.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from dtype_doctor.ops import CONV_OPS, op_name
from dtype_doctor.records import TensorMeta
from dtype_doctor.trace.gpus import GpuProfile



@lru_cache(maxsize=1)
def op_dtypes() -> dict[str, dict]:
    """{op: {"cpu": frozenset, "cuda": frozenset, "cuda_needs": {dtype: (major, minor)}}}."""
    text = resources.files("dtype_doctor.data").joinpath("op_dtypes.json").read_text()
    out: dict[str, dict] = {}
    for k, lists in json.loads(text)["ops"].items():
        needs = {d: tuple(int(x) for x in cap.split(".")) for d, cap in lists.get("cuda_needs", {}).items()}
        out[k] = {"cpu": frozenset(lists["cpu"]), "cuda": frozenset(lists["cuda"]), "cuda_needs": needs}
    return out


def _lists(op: str) -> dict | None:
    name = op_name(op)
    table = op_dtypes()
    bare = name.lstrip("_").removeprefix("native_").rstrip("_")
    # The aten ops an OpInfo's op decomposes into: max_pool2d_with_indices, nll_loss_forward,
    # _histogramdd_bin_edges / _from_bin_cts / _from_bin_tensors (torch.histogramdd).
    suffixes = ("_forward", "_with_indices", "_out_frame", "_bin_edges", "_from_bin_cts", "_from_bin_tensors")
    for key in (name, bare, *(bare.removesuffix(s) for s in suffixes)):
        if key in table:
            return table[key]
    return None


def on_cuda(
    op: str,
    operands: tuple[TensorMeta, ...],
    cpu_error: str | None,
    unsupported: str | None,
    gpu: GpuProfile | None,
    *,
    cpu_kernel: bool = True,
) -> str | None:
    """The CUDA verdict (None: accepted; else the reason) from the CPU probe's verdict.

    `unsupported` is the dtype the CPU kernel lacks, when that was the CPU's reason; `gpu`
    the target GPU (None: one recent enough for every dtype op_db gates on capability);
    `cpu_kernel` False for an op this CPU build has no kernel for (then op_db's CUDA list
    alone decides).
    """
    name = op_name(op)
    lists = _lists(op)
    cuda = cuda_dtypes(lists, gpu) if lists is not None else None
    if cpu_error is not None:
        if unsupported and cuda is not None and unsupported in cuda:
            return None  # CUDA implements what this CPU lacks
        return cpu_error
    # An op's dtype lists are for its first tensor (OpInfo's sample input, 0-dim or not).
    if cuda is not None:
        for t in [t for t in operands if t.role not in ("index", "mask")][:1]:
            if (t.dtype in lists["cpu"] or not cpu_kernel) and t.dtype not in cuda:
                needs = lists.get("cuda_needs", {}).get(t.dtype)
                if needs is not None and gpu is not None:
                    return f'"{name}" has no CUDA kernel for {t.dtype} on {gpu} (PyTorch op database: {t.dtype} needs compute capability {needs[0]}.{needs[1]})'
                return f'"{name}" has no CUDA kernel for {t.dtype} (PyTorch op database: CUDA supports {", ".join(sorted(cuda - {"complex32"}))})'
    if name in CONV_OPS:
        x = [t for t in operands if t.role not in ("bias",) and not t.is_scalar]
        bias = [t for t in operands if t.role == "bias"]
        if bias and x and bias[0].dtype != x[0].dtype:
            return f"Input type ({x[0].dtype}) and bias type ({bias[0].dtype}) should be the same (cuDNN checks the bias; this CPU's slow path does not)"
    return None


def cuda_dtypes(lists: dict, gpu: GpuProfile | None) -> frozenset[str]:
    """The op's CUDA dtypes on `gpu`: those op_db gates on a higher capability left out."""
    needs = lists.get("cuda_needs", {})
    if gpu is None or not needs:
        return lists["cuda"]
    return frozenset(d for d in lists["cuda"] if d not in needs or gpu.capability >= needs[d])
