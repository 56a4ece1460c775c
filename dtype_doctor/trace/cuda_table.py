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
| layer_norm / group_norm with a weight or bias of another dtype than the input (an fp16 activation into an fp32 LayerNorm, outside autocast) | runs (the CPU kernels take mixed types) | refused: "expected scalar type Half but found Float" | the CUDA kernels read gamma/beta as the input's scalar type (layer_norm_kernel.cu, group_norm_kernel.cu); measured on an H100 (benchmarks/oracle_cuda.py) |
| batch norm (nn.BatchNorm*, F.batch_norm, instance_norm) whose weight, bias and running stats are not of one type, or whose input differs from them beyond a half input with float32 state | refused or run by the CPU kernel | refused: "Expected tensor for argument #2 'weight' to have the same type as tensor for argument #5 'running_var'" | `cudnn_batch_norm`'s `checkAllSameType`, with the mixed half/float32 case cuDNN takes; a CUDA build of torch routes fake CUDA tensors to `cudnn_batch_norm`, which has no CPU kernel to probe; measured on an H100. (`torch.native_batch_norm` called directly takes CUDA's native kernel, which accepts running stats of another dtype: the simulation judges as cuDNN does) |
| an op the CPU runs on mixed dtypes (an int32 addend of `addmv`, a bf16 `igamma` with an fp32 argument) | runs, promoted | runs, promoted: op_db's list is checked for the promoted dtype, not the first tensor's | measured on an H100 |
| `native_dropout_backward` with a non-bool mask | runs | refused: "Mask should be Bool Scalar Type…" | measured on an H100 |
| `embedding` / `index_select` with a CPU index and a CUDA weight | — (one device) | refused: "…index is on cpu, different from other tensors on cuda:0" | measured on an H100; meta kernels do not check it, the probe does (trace/probe.py) |
| an RNN's hidden state of another dtype than its input | refused by the CPU kernels | refused: "Input and hidden tensors are not the same dtype" | `_cudnn_rnn` (a CUDA build routes fake CUDA tensors there; no CPU kernel to probe); measured on an H100 |
| integer `max_unpool1d/2d/3d` | refused: floating kernels only | runs | the CUDA kernels dispatch `AT_DISPATCH_ALL_TYPES_AND(Half)` (MaxUnpooling.cu); op_db samples floating types only; measured on an H100 |
| the statistics a forward saves for its backward (layer_norm's mean/rstd, batch norm's save_mean/save_invstd, weight_norm's norms), float16/bfloat16 input | layer_norm and batch norm save them in the input's dtype (float32 when the parameters are float32), and the CPU backward refuses float32 ones: "expected scalar type BFloat16 but found Float"; weight_norm saves float32 norms, as CUDA does, but the fake kernel a simulation runs saves float16 ones for a float16 weight | saved in float32 (the accumulate type), and the backward reads them as float32 | `layer_norm_cuda` / `LayerNormBackwardKernelImplInternal` (aten/src/ATen/native/cuda/layer_norm_kernel.cu: `at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true)`, `mean.data_ptr<T_ACC>()`); `batch_norm_cuda` / `batch_norm_backward_cuda` (aten/src/ATen/native/cuda/Normalization.cu); `weight_norm_cuda` (aten/src/ATen/native/cuda/WeightNorm.cu: "If Half or BFloat16, stash norms as float"). A simulated backward is probed on the CPU with the statistics its CPU forward would have saved, once CUDA's own check (float32 statistics) has passed (SAVED_FOR_BACKWARD) |

Anything not in this table is assumed to behave on CUDA as on this CPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

from dtype_doctor.ops.families import CONV_OPS, op_name
from dtype_doctor.records import INTEGER, TensorMeta
from dtype_doctor.machine.gpus import GpuProfile
from dtype_doctor.trace.verdicts import scalar_type_name

# Dtypes a CUDA kernel dispatches that op_db leaves out of its lists (it samples floating types).
_CUDA_ALSO = {"max_unpool2d": INTEGER, "max_unpool3d": INTEGER}
_NORMS_SAME_TYPE = ("native_layer_norm", "native_group_norm")
_BATCH_NORMS = ("cudnn_batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training")



def _accumulate(dtype: str) -> str:
    """at::toAccumulateType(dtype, /*is_cuda=*/true) for floating dtypes: float32, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


def _half_as_float(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass(frozen=True)
class SavedForBackward:
    """Tensors a CUDA forward saves for its backward in a dtype of its own (a row of the table).

    `forwards` save their outputs `outputs`, which the `backwards` read as `arguments`. CUDA
    makes them `cuda(dtype of reference)`, the reference being an argument of the forward
    (`reference[0]`) and of the backward (`reference[1]`). This CPU's forward may save them in
    another dtype, and its backward then refuses CUDA's: the probe asks the CPU backward with
    what `cpu_forward(*cpu_arguments(backward's arguments))` saves instead.
    """

    forwards: frozenset[str]
    outputs: tuple[int, ...]
    backwards: frozenset[str]
    arguments: tuple[str, ...]
    reference: tuple[str, str]
    cuda: Callable[[str], str]
    cpu_forward: str
    cpu_arguments: Callable[[dict[str, Any]], tuple]
    source: str


SAVED_FOR_BACKWARD = (
    SavedForBackward(
        forwards=frozenset({"native_layer_norm"}),
        outputs=(1, 2),
        backwards=frozenset({"native_layer_norm_backward"}),
        arguments=("mean", "rstd"),
        reference=("input", "input"),
        cuda=_accumulate,
        cpu_forward="native_layer_norm",
        cpu_arguments=lambda a: (a["input"], a["normalized_shape"], a["weight"], a["bias"], 1e-5),
        source="aten/src/ATen/native/cuda/layer_norm_kernel.cu: layer_norm_cuda, LayerNormBackwardKernelImplInternal",
    ),
    SavedForBackward(
        forwards=frozenset({"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                            "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_no_update"}),
        outputs=(1, 2),
        backwards=frozenset({"native_batch_norm_backward", "batch_norm_backward"}),
        arguments=("save_mean", "save_invstd", "save_var"),
        reference=("input", "input"),
        cuda=_accumulate,
        cpu_forward="native_batch_norm",
        cpu_arguments=lambda a: (a["input"], a["weight"], None, a["running_mean"], a["running_var"],
                                 bool(a.get("train", a.get("update", True))), 0.1, a["eps"]),
        source="aten/src/ATen/native/cuda/Normalization.cu: batch_norm_cuda, batch_norm_backward_cuda",
    ),
    SavedForBackward(
        forwards=frozenset({"_weight_norm_interface"}),
        outputs=(1,),
        backwards=frozenset({"_weight_norm_interface_backward"}),
        arguments=("saved_norms",),
        reference=("g", "saved_g"),
        cuda=_half_as_float,
        cpu_forward="_weight_norm_interface",
        cpu_arguments=lambda a: (a["saved_v"], a["saved_g"], a["dim"]),
        source="aten/src/ATen/native/cuda/WeightNorm.cu: weight_norm_cuda (\"If Half or BFloat16, stash norms as float\")",
    ),
)
_SAVED_BY_FORWARD = {name: entry for entry in SAVED_FOR_BACKWARD for name in entry.forwards}
_SAVED_BY_BACKWARD = {name: entry for entry in SAVED_FOR_BACKWARD for name in entry.backwards}


def saved_by_forward(name: str) -> SavedForBackward | None:
    """The table row of a forward op (its aten name without overload: "native_layer_norm"), if any."""
    return _SAVED_BY_FORWARD.get(name)


def saved_for_backward(name: str) -> SavedForBackward | None:
    """The table row of a backward op ("native_layer_norm_backward"), if any."""
    return _SAVED_BY_BACKWARD.get(name)


def saved_refusal(entry: SavedForBackward, dtypes: dict[str, str]) -> str | None:
    """CUDA's refusal of a backward given saved tensors not of the dtype its forward saves
    (`dtypes`: the backward's tensor arguments by name), in its words (`data_ptr<T_ACC>()`)."""
    reference = dtypes.get(entry.reference[1])
    if reference is None:
        return None
    want = entry.cuda(reference)
    for name in entry.arguments:
        got = dtypes.get(name)
        if got is not None and got != want:
            return f"expected scalar type {scalar_type_name(want)} but found {scalar_type_name(got)}"
    return None

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
        if unsupported and (cuda is not None and unsupported in cuda or unsupported in _CUDA_ALSO.get(name, ())):
            return None  # CUDA implements what this CPU lacks
        return cpu_error
    fact = cuda_kernel_check(name, operands)
    if fact is not None:
        return fact
    # An op's dtype lists are for its first tensor (OpInfo's sample input, 0-dim or not); an
    # op the CPU ran on mixed dtypes computes in the dtype it promoted them to (an int32
    # addend of addmv, a bf16 igamma with an fp32 argument: measured on an H100).
    data = [t for t in operands if t.role not in ("index", "mask")]
    if cuda is not None and data:
        dtype = _promoted(data) if cpu_kernel else data[0].dtype
        if (dtype in lists["cpu"] or not cpu_kernel) and dtype not in cuda:
            needs = lists.get("cuda_needs", {}).get(dtype)
            if needs is not None and gpu is not None:
                return f'"{name}" has no CUDA kernel for {dtype} on {gpu} (PyTorch op database: {dtype} needs compute capability {needs[0]}.{needs[1]})'
            return f'"{name}" has no CUDA kernel for {dtype} (PyTorch op database: CUDA supports {", ".join(sorted(cuda - {"complex32"}))})'
    if name in CONV_OPS:
        x = [t for t in operands if t.role not in ("bias",) and not t.is_scalar]
        bias = [t for t in operands if t.role == "bias"]
        if bias and x and bias[0].dtype != x[0].dtype:
            return f"Input type ({x[0].dtype}) and bias type ({bias[0].dtype}) should be the same (cuDNN checks the bias; this CPU's slow path does not)"
    return None


def cuda_kernel_check(name: str, operands: tuple[TensorMeta, ...]) -> str | None:
    """A CUDA kernel's own dtype check that the CPU kernel does not make, or that runs in a
    kernel this CPU build lacks (cuDNN's batch norm and RNN): CUDA's refusal, in its words.
    Each was measured against the real kernel on an H100 (benchmarks/oracle_cuda.py)."""
    if name == "native_dropout_backward":
        mask = next((t for t in operands if t.role == "mask"), None)
        return None if mask is None or mask.dtype == "bool" else f"Mask should be Bool Scalar Type{scalar_type_name(mask.dtype)}"
    tensors = [t for t in operands if not t.is_scalar and t.role not in ("index", "mask")]
    inputs = [t for t in tensors if t.role == "input"]
    if not inputs:
        return None
    x, params = inputs[0], [t for t in tensors if t.role in ("weight", "bias")]
    if name in _NORMS_SAME_TYPE:
        other = next((t for t in params if t.dtype != x.dtype), None)
        if other is not None:
            return f"expected scalar type {scalar_type_name(x.dtype)} but found {scalar_type_name(other.dtype)}"
    if name in _BATCH_NORMS:
        return _cudnn_batch_norm(x, params + [t for t in tensors if t.role == "buffer"])
    if name == "_cudnn_rnn":
        hidden = next((t for t in inputs[1:] if t.dtype != x.dtype), None)
        if hidden is not None:
            return (f"Input and hidden tensors are not the same dtype, found input tensor with "
                    f"{scalar_type_name(x.dtype)} and hidden tensor with {scalar_type_name(hidden.dtype)}")
    return None


def _cudnn_batch_norm(x: TensorMeta, state: list[TensorMeta]) -> str | None:
    """cuDNN's batch norm (what F.batch_norm / nn.BatchNorm* / instance_norm take on CUDA):
    weight, bias and running stats all of one type, and the input of that type too, or half
    with float32 state (checkAllSameType in aten/src/ATen/native/cudnn/BatchNorm.cpp)."""
    if not state:
        return None
    ref = state[0]
    other = next((t for t in state[1:] if t.dtype != ref.dtype), None)
    if other is not None:
        return (f"Expected tensor for argument #2 '{ref.role}' to have the same type as tensor for '{other.name or other.role}'; "
                f"but type torch.cuda.{scalar_type_name(ref.dtype)}Tensor does not equal "
                f"torch.cuda.{scalar_type_name(other.dtype)}Tensor (while checking arguments for cudnn_batch_norm)")
    if ref.dtype != x.dtype and not (x.dtype in ("float16", "bfloat16") and ref.dtype == "float32"):
        return (f"Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 '{ref.role}'; "
                f"but type torch.cuda.{scalar_type_name(x.dtype)}Tensor does not equal "
                f"torch.cuda.{scalar_type_name(ref.dtype)}Tensor (while checking arguments for cudnn_batch_norm)")
    return None


def _promoted(data: list[TensorMeta]) -> str:
    """The dtype an elementwise kernel computes mixed operands in (torch's type promotion)."""
    if len({t.dtype for t in data}) == 1:
        return data[0].dtype
    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    metas = [torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta") for t in data]
    return str(elementwise_dtypes(*metas, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]).removeprefix("torch.")


def cuda_dtypes(lists: dict, gpu: GpuProfile | None) -> frozenset[str]:
    """The op's CUDA dtypes on `gpu`: those op_db gates on a higher capability left out."""
    needs = lists.get("cuda_needs", {})
    if gpu is None or not needs:
        return lists["cuda"]
    return frozenset(d for d in lists["cuda"] if d not in needs or gpu.capability >= needs[d])
