"""Attention kernels: which SDPA backend CUDA would pick for a recorded call, and what flash-attn needs.

No torch: pure functions of recorded shapes, dtypes and a GPU's compute capability, so a CPU-only
machine can say what an A100 or a T4 would run.

The SDPA backend choice itself is ops/sdpa.py (torch's select_sdp_backend, as data).

flash-attn (the flash_attn package behind attn_implementation="flash_attention_2") checks in its
csrc/flash_attn/flash_api.cpp (mha_fwd): "FlashAttention only supports Ampere GPUs or newer." and
"FlashAttention only support fp16 and bf16 data type"; transformers 5 only warns at load
(modeling_utils.py, _flash_attn_can_dispatch: "Flash Attention 2 only supports torch.float16 and
torch.bfloat16 dtypes, but the current dype in ... is torch.float32"), so fp32 weights fail at the
first forward. FlashAttention-3 (flash_attn_interface) targets Hopper: transformers requires
compute capability >= 8 for it (FLASH_ATTENTION_COMPATIBILITY_MATRIX), the kernels sm90.
"""

from __future__ import annotations

from typing import Any

from dtype_doctor.machine.fake_packages import FLASH_DTYPE_ERROR, FLASH_GPU_ERROR
from dtype_doctor.ops.sdpa import SdpaCall, cuda_backend
from dtype_doctor.records import HALF, OpCall, Trace

SDPA_OP = "torch.nn.functional.scaled_dot_product_attention"
FLASH_IMPLEMENTATIONS = {"flash_attention_2": 2, "flash_attention_3": 3}
# flash-attn's own words (FLASH_DTYPE_ERROR, FLASH_GPU_ERROR) are machine.fake_packages': the simulated
# flash-attn raises them at the first forward, as the package does.
# The minimum compute capability of each flash-attn generation (FA2: Ampere; FA3: Hopper).
FLASH_MIN_CAPABILITY = {2: (8, 0), 3: (9, 0)}


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
