"""Op families, one table: which ops are a matmul, a convolution, a norm, attention, a loss,
and which run on tensor cores. Rules, the CUDA kernel table and compare's precision probe
read them here. No torch: op names are strings ("aten.addmm.default", "torch.conv2d").
"""

from __future__ import annotations

from functools import lru_cache

MATMUL = frozenset(
    {
        "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.addmv", "aten.mv",
        "aten.dot", "aten.vdot", "aten.addr", "aten._addmm_activation", "aten.matmul", "aten.linear",
    }
)
CONV = frozenset(
    {"aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d"}
    | {f"torch.{c}" for c in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")}
)
NORM = frozenset(
    {
        "aten.native_layer_norm", "aten.native_group_norm", "aten.native_batch_norm",
        "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_no_training",
        "aten._native_batch_norm_legit_functional",
    }
)
INDEX_PUT = frozenset({"aten.index_put", "aten.index_put_", "aten._index_put_impl_", "aten._index_put_impl"})
ATTENTION = frozenset(
    {
        "torch.nn.functional.scaled_dot_product_attention",
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._scaled_dot_product_attention_math",
    }
)
EMBEDDING = frozenset({"aten.embedding", "aten.embedding_bag", "aten._embedding_bag"})
CLASS_LOSS = frozenset({"aten.nll_loss_forward", "aten.nll_loss2d_forward", "aten.nll_loss", "aten.nll_loss_nd"})
VALUE_LOSS = frozenset(
    {
        "aten.mse_loss", "aten.l1_loss", "aten.smooth_l1_loss", "aten.huber_loss",
        "aten.binary_cross_entropy_with_logits", "aten.binary_cross_entropy",
    }
)
LOSSES = CLASS_LOSS | VALUE_LOSS

@lru_cache(maxsize=4096)
def base_op(op: str) -> str:
    """'aten.addmm.default' → 'aten.addmm'; function names are kept whole."""
    if op.startswith("aten."):
        parts = op.split(".")
        return ".".join(parts[:2])
    return op


def family(op: str) -> str:
    """One name for an op seen at both levels (torch.conv2d and aten.convolution → "conv")."""
    base = base_op(op)
    for name, members in (("matmul", MATMUL), ("conv", CONV), ("norm", NORM), ("attention", ATTENTION)):
        if base in members:
            return name
    return base


def op_name(op: str) -> str:
    """'aten.addmm.default' → 'addmm'; 'torch.nn.functional.max_pool1d' → 'max_pool1d'."""
    if op.startswith("aten."):
        return op.removeprefix("aten.").split(".")[0]
    return op.rsplit(".", 1)[-1]


# By bare name (op_name): the ops that run on tensor cores in half precision; before compute
# capability 8.0 there are no bf16 tensor cores, and their bf16 kernels run emulated (DD107).
TENSOR_CORE_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution",
     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math"}
)
# By bare name: the convolutions (cuDNN checks their bias dtype).
CONV_OPS = frozenset({op_name(op) for op in CONV})
# By bare name: the ops whose half-precision rounding compare's table asks about.
PRECISION_OPS = TENSOR_CORE_OPS | {"conv1d", "conv2d", "conv3d", "cudnn_convolution", "mkldnn_convolution"}


# The collectives FSDP, DDP and DeepSpeed issue, as the dispatcher names them (c10d.<name>,
# _c10d_functional.<name>): what the fake process group lets the recorder see (trace/world.py).
COLLECTIVES = ("allgather", "_allgather_base_", "reduce_scatter", "_reduce_scatter_base_", "allreduce_", "broadcast_",
               "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


def is_collective(op_name: str) -> bool:
    return op_name.startswith(("c10d.", "_c10d_functional.")) and any(c in op_name for c in COLLECTIVES)


def is_reduction(op_name: str) -> bool:
    """A collective that sums tensors across ranks (reduce-scatter, all-reduce)."""
    return is_collective(op_name) and "reduce" in op_name
