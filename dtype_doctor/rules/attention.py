"""Attention kernels: which SDPA backend CUDA would pick for a recorded call, and what flash-attn needs.

No torch: pure functions of recorded shapes, dtypes and a GPU's compute capability, so a CPU-only
machine can say what an A100 or a T4 would run.

The SDPA choice follows torch's own dispatcher, `select_sdp_backend` in
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (and its checks in sdp_utils_cpp.h), for dense
inputs with every backend enabled: flash attention first, then memory-efficient attention, then the
math fallback. Each backend's filters, in the order torch runs them:

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
cannot see), backends a user turned off (torch.nn.attention.sdpa_kernel), nested tensors, and
storage alignment (dense tensors from the caching allocator are aligned).

flash-attn (the flash_attn package behind attn_implementation="flash_attention_2") checks in its
csrc/flash_attn/flash_api.cpp (mha_fwd): "FlashAttention only supports Ampere GPUs or newer." and
"FlashAttention only support fp16 and bf16 data type"; transformers 5 only warns at load
(modeling_utils.py, _flash_attn_can_dispatch: "Flash Attention 2 only supports torch.float16 and
torch.bfloat16 dtypes, but the current dype in ... is torch.float32"), so fp32 weights fail at the
first forward. FlashAttention-3 (flash_attn_interface) targets Hopper: transformers requires
compute capability >= 8 for it (FLASH_ATTENTION_COMPATIBILITY_MATRIX), the kernels sm90.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.machine.fake_packages import FLASH_DTYPE_ERROR, FLASH_GPU_ERROR
from dtype_doctor.records import HALF, OpCall, TensorMeta, Trace

SDPA_OP = "torch.nn.functional.scaled_dot_product_attention"
FLASH_IMPLEMENTATIONS = {"flash_attention_2": 2, "flash_attention_3": 3}
# flash-attn's own words (FLASH_DTYPE_ERROR, FLASH_GPU_ERROR) are machine.fake_packages': the simulated
# flash-attn raises them at the first forward, as the package does.
# The minimum compute capability of each flash-attn generation (FA2: Ampere; FA3: Hopper).
FLASH_MIN_CAPABILITY = {2: (8, 0), 3: (9, 0)}


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


def cuda_backend(c: SdpaCall, cc: tuple[int, int]) -> BackendChoice:
    """The SDPA backend torch's CUDA dispatcher picks for `c` on capability `cc` (every backend enabled)."""
    flash = flash_refusal(c, cc)
    if flash is None:
        return BackendChoice("flash", f"{c.query.dtype}, head dim {c.head_dim}, no mask: flash attention's filters pass")
    efficient = efficient_refusal(c, cc)
    if efficient is None:
        return BackendChoice("efficient", f"not flash: {flash}; memory-efficient attention's filters pass")
    return BackendChoice("math", f"not flash: {flash}; not memory-efficient: {efficient}; the math fallback runs "
                                 f"it as matmuls and a softmax in {c.query.dtype}")


def flash_attn_refusal(version: int, dtype: str | None, cc: tuple[int, int] | None, device: str) -> tuple[str, str] | None:
    """(flash-attn's error, why) for attn_implementation=flash_attention_{version} on this target, or None."""
    if not device.startswith("cuda"):
        return ("FlashAttention is not available on CPU", f"flash_attention_{version} runs on CUDA GPUs only; the target is {device}")
    low = FLASH_MIN_CAPABILITY[version]
    if cc is not None and cc < low:
        return (FLASH_GPU_ERROR, f"flash_attention_{version} needs compute capability {low[0]}.{low[1]} or newer; "
                                 f"the target GPU is {cc[0]}.{cc[1]}")
    if dtype is not None and dtype not in HALF:
        return (FLASH_DTYPE_ERROR, f"flash_attention_{version} computes in float16 or bfloat16 only; the weights are {dtype}, "
                                   "and transformers casts query, key and value to the weights' dtype before the kernel")
    return None


def flash_attn_raised(trace: Trace, error: str) -> bool:
    """Whether the traced step stopped on flash-attn's own refusal `error` (the simulated package raised it)."""
    failure = trace.failure
    return failure is not None and error in (failure.message or "")


def implementation_of(trace: Trace) -> tuple[str | None, str | None, str | None]:
    """(the attention implementation the user's model runs, where it was set, what the trace ran instead)."""
    loaded = trace.loaded
    if loaded is not None and loaded.attn_implementation:
        return loaded.attn_implementation, loaded.attn_origin, loaded.attn_traced_as
    if trace.model.attn_implementation:
        return trace.model.attn_implementation, "model config", None
    return None, None, None


def sdpa_calls(trace: Trace) -> list[tuple[OpCall, SdpaCall]]:
    out = []
    for op in trace.ops:
        if op.op == SDPA_OP and op.phase == "forward":
            call = SdpaCall.of(op, requires_grad=trace.train)
            if call is not None:
                out.append((op, call))
    return out


def attention_of(trace: Trace, capability: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """`target.attention` (docs/report.md): the implementation, and for SDPA the backend CUDA would pick, and why."""
    impl, origin, traced_as = implementation_of(trace)
    calls = sdpa_calls(trace)
    if impl is None and not calls:
        return None
    cc = capability or trace.gpu_capability
    out: dict[str, Any] = {"implementation": impl, "origin": origin, "traced_as": traced_as}
    if traced_as:
        out["note"] = (f"{impl} cannot run on this machine: the trace ran {traced_as} in its place, so the SDPA "
                       f"rows say what attn_implementation='{traced_as}' would run")
    if calls:
        seen: dict[tuple[Any, ...], dict[str, Any]] = {}
        for op, c in calls:
            row = seen.get(c.key_tuple())
            if row is None:
                row = seen[c.key_tuple()] = {"module": op.module, "dtype": c.query.dtype, "head_dim": c.head_dim,
                                             "mask": c.mask is not None, "is_causal": c.is_causal, "calls": 0}
                if cc is not None and trace.device.startswith("cuda"):
                    row.update(cuda_backend(c, cc).to_dict())
            row["calls"] += 1
        rows = list(seen.values())
        out["sdpa"] = rows
        if cc is not None and trace.device.startswith("cuda"):
            main = max(rows, key=lambda r: r["calls"])
            out["sdpa_backend"], out["why"] = main["backend"], main["why"]
            out["gpu"] = trace.gpu or f"compute capability {cc[0]}.{cc[1]}"
        else:
            out["sdpa_backend"] = None
            out["why"] = _not_cuda(trace)
    return out


def _not_cuda(trace: Trace) -> str:
    """Why no CUDA backend is named, in the words of the machine the trace is for: on a Mac, CUDA's
    flash / memory-efficient choice is no part of the answer (the report describes the machine asked for)."""
    if trace.on_mac:
        return "the target is a Mac (mps): SDPA runs torch's MPS kernels there (docs/mps.md)"
    return (f"the trace ran on {trace.device}; CUDA's choice depends on the GPU: "
            "trace with --simulate --device cuda --gpu NAME to see it")
