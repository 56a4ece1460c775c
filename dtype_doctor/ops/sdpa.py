"""Which SDPA backend CUDA's dispatcher picks for one scaled_dot_product_attention call.

No torch: pure functions of shapes, dtypes and a GPU's compute capability, so a CPU-only machine
can say what an A100 or a T4 would run. The rules name the choice in the report
(rules/attention.py); a simulated CUDA trace runs the kernel it names (trace/sdpa_route.py).

The SDPA choice follows torch's own dispatcher, `select_sdp_backend` in
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (and its checks in sdp_utils_cpp.h), for dense
inputs with the fused backends `enabled` (the trace passes torch.backends.cuda's flags; the report's
rows assume every backend on): flash attention first, then memory-efficient attention, then the math
fallback. Each backend's filters, in the order torch runs them:

- flash (can_use_flash_attention): 4-D q/k/v; no attn_mask; q, k, v with one head dim <= 256;
  compute capability in [8.0, 12.1]; on sm86/89/120/121 with gradients, head dim <= 192 (or > 224
  without dropout); is_causal only with equal query and key lengths; q, k, v all float16 or
  bfloat16; one batch size, and one head count unless enable_gqa (heads of q a multiple of k's).
- memory-efficient (can_use_mem_efficient_attention): capability in [5.0, 12.1]; 4-D q/k/v;
  q and k one head dim, and q's and v's head dims multiples of the GEMM alignment (sm80+: 8 for
  half, 4 for float32; sm7x: 8 for half, 1 for float32; below: 1); dtypes float16/float32, plus
  bfloat16 from sm80; an attn_mask is allowed.
- math: always (it runs the attention as matmuls and a softmax, in the inputs' dtype).

Not modelled: the cuDNN backend, which torch tries first on sm90/sm100 when the cuDNN it loads is
newer than 9.15 (check_prefer_cudnn_attention; the installed cuDNN decides, which a simulation
cannot see), nested tensors, and storage alignment (dense tensors from the caching allocator are
aligned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection

from dtype_doctor.records import HALF, OpCall, TensorMeta

FUSED = ("flash", "efficient")  # the fused backends modelled, in the dispatcher's order


@dataclass(frozen=True, slots=True)
class SdpaCall:
    """One scaled_dot_product_attention call as the CUDA dispatcher sees it."""

    query: TensorMeta
    key: TensorMeta
    value: TensorMeta
    mask: TensorMeta | None = None
    dropout: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    requires_grad: bool = False

    @classmethod
    def of(cls, op: OpCall, *, requires_grad: bool = False) -> "SdpaCall | None":
        data = [t for t in op.operands if t.role != "mask"]
        if len(data) < 3:
            return None
        mask = next((t for t in op.operands if t.role == "mask"), None)
        return cls(data[0], data[1], data[2], mask, float(op.attr("dropout_p", 0.0) or 0.0),
                   bool(op.attr("is_causal", False)), bool(op.attr("enable_gqa", False)), requires_grad)

    @property
    def head_dim(self) -> int | None:
        return self.query.shape[-1] if self.query.shape else None

    def key_tuple(self) -> tuple[Any, ...]:
        return (self.query.dtype, self.query.shape, self.key.shape, self.value.shape, self.mask is not None,
                self.dropout, self.is_causal, self.enable_gqa, self.requires_grad)


def _in(cc: tuple[int, int], low: tuple[int, int], high: tuple[int, int]) -> bool:
    return low <= cc <= high


def _four_d(c: SdpaCall) -> str | None:
    if not (len(c.query.shape) == len(c.key.shape) == len(c.value.shape) == 4):
        return "query, key and value are not all 4-D"
    return None


def _heads(c: SdpaCall, *, supports_gqa: bool) -> str | None:
    q, k, v = c.query.shape, c.key.shape, c.value.shape
    if not (q[0] == k[0] == v[0]):
        return "query, key and value differ in batch size"
    if c.enable_gqa and supports_gqa:
        if k[1] != v[1] or q[1] % k[1]:
            return "grouped-query heads: query's heads are not a multiple of key's"
        return None
    if not (q[1] == k[1] == v[1]):
        return "query, key and value differ in head count (enable_gqa not set)"
    if 0 in (q[2], k[2]):
        return "a sequence of length 0"
    return None


def _dtypes(c: SdpaCall, allowed: tuple[str, ...]) -> str | None:
    dts = {c.query.dtype, c.key.dtype, c.value.dtype}
    if len(dts) > 1 or c.query.dtype not in allowed:
        return f"{'/'.join(sorted(dts))} inputs (it takes {', '.join(allowed)}, all one dtype)"
    return None


def flash_refusal(c: SdpaCall, cc: tuple[int, int]) -> str | None:
    """Why torch's flash backend would not run this call on a GPU of capability `cc` (None: it would)."""
    if (why := _four_d(c)) is not None:
        return why
    if c.mask is not None:
        return "an attn_mask is passed (flash takes none; is_causal only)"
    q, k, v = c.query.shape[-1], c.key.shape[-1], c.value.shape[-1]
    if not (q == k == v) or q > 256:
        return f"head dims {q}/{k}/{v} (flash needs one head dim, at most 256)"
    if not _in(cc, (8, 0), (12, 1)):
        return f"compute capability {cc[0]}.{cc[1]} (flash needs sm80 to sm121)"
    if c.requires_grad and (_in(cc, (8, 6), (8, 9)) or _in(cc, (12, 0), (12, 1))):
        if not (q <= 192 or (q > 224 and c.dropout == 0.0)):
            return f"training with head dim {q} on sm{cc[0]}{cc[1]} (flash's backward takes <= 192 there)"
    if c.is_causal and c.query.shape[-2] != c.key.shape[-2]:
        return "is_causal with query and key of different lengths"
    if (why := _dtypes(c, ("float16", "bfloat16"))) is not None:
        return why
    return _heads(c, supports_gqa=True)


def _gemm_alignment(dtype: str, cc: tuple[int, int]) -> int:
    """sdp_utils.cpp minimum_gemm_alignment: tensor cores want 128 bits per row."""
    half = dtype in HALF
    use_tc = cc[0] >= 8 or (cc[0] >= 7 and half)
    align = 4 if cc[0] >= 8 else 1
    return max(align, 128 // (16 if half else 32)) if use_tc else align


def efficient_refusal(c: SdpaCall, cc: tuple[int, int]) -> str | None:
    """Why torch's memory-efficient backend would not run this call on capability `cc`."""
    if not _in(cc, (5, 0), (12, 1)):
        return f"compute capability {cc[0]}.{cc[1]} (memory-efficient needs sm50 to sm121)"
    if (why := _four_d(c)) is not None:
        return why
    align = _gemm_alignment(c.query.dtype, cc)
    q, k, v = c.query.shape[-1], c.key.shape[-1], c.value.shape[-1]
    if q != k or q % align or v % align or q <= 0 or v <= 0:
        return f"head dims {q}/{k}/{v} (memory-efficient needs q and k alike, multiples of {align})"
    if (why := _heads(c, supports_gqa=True)) is not None:
        return why
    allowed = ("float16", "float32", "bfloat16") if cc[0] >= 8 else ("float16", "float32")
    return _dtypes(c, allowed)


@dataclass(frozen=True, slots=True)
class BackendChoice:
    backend: str  # flash | efficient | math
    why: str  # why this one, and why not the ones before it

    def to_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "why": self.why}


def cuda_backend(c: SdpaCall, cc: tuple[int, int], enabled: Collection[str] = FUSED) -> BackendChoice:
    """The SDPA backend torch's CUDA dispatcher picks for `c` on capability `cc`, with the fused
    backends in `enabled` (default: every one; torch.backends.cuda.enable_flash_sdp(False) or
    torch.nn.attention.sdpa_kernel turn one off: check_runtime_disabled_flash / _mem_efficient)."""
    flash = flash_refusal(c, cc) if "flash" in enabled else "flash attention is turned off"
    if flash is None:
        return BackendChoice("flash", f"{c.query.dtype}, head dim {c.head_dim}, no mask: flash attention's filters pass")
    efficient = efficient_refusal(c, cc) if "efficient" in enabled else "memory-efficient attention is turned off"
    if efficient is None:
        return BackendChoice("efficient", f"not flash: {flash}; memory-efficient attention's filters pass")
    return BackendChoice("math", f"not flash: {flash}; not memory-efficient: {efficient}; the math fallback runs "
                                 f"it as matmuls and a softmax in {c.query.dtype}")
