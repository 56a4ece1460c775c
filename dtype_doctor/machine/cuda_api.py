"""The CUDA API a script can ask under `run --simulate`, as data: every public name of `torch.cuda`
(and its `random`, `memory`, `amp`, `graphs`, `streams`, `nvtx` modules), `torch.accelerator`,
`torch.backends.cuda`, `torch.backends.cudnn` and the build's `torch.version.cuda`, each with how
the simulated GPU answers it.

tests/test_cuda_api.py walks the installed torch's surface and fails on a name in no row, so a
torch release that adds a CUDA function fails a test, not a user's run. A name the simulation
cannot answer is NOT_SIMULATED: calling it stops the script there, and the report's coverage names
it (`coverage.not_simulated`), instead of a CPU-only build's error blamed on the script.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

PROFILE = "profile"  # answered as the --gpu profile's GPU (machine/gpus.py)
MEMORY = "memory"  # counted from the simulated tensors (cuda_surface.SimulatedMemory)
RNG = "rng"  # the CUDA generator's seed and state, kept by the simulation
STREAMS = "streams"  # streams, events, contexts that select or order nothing: nothing runs on a device
NO_OP = "no-op"  # accepted; there is no device work to wait for, free, select or annotate
OWN = "torch's own"  # works unchanged without a GPU: flags, decorators, error classes, autocast and GradScaler (patched elsewhere)
NOT_SIMULATED = "not simulated"

_CUDA_PROFILE = "is_available device_count current_device get_device_name get_device_capability get_device_properties " \
    "is_bf16_supported is_tf32_supported get_arch_list get_gencode_flags can_device_access_peer has_half has_magma " \
    "get_sync_debug_mode get_allocator_backend get_per_process_memory_fraction is_initialized"
_CUDA_MEMORY = "memory_allocated max_memory_allocated memory_reserved max_memory_reserved memory_cached max_memory_cached " \
    "mem_get_info memory_stats memory_stats_as_nested_dict memory_summary reset_peak_memory_stats reset_max_memory_allocated " \
    "reset_max_memory_cached reset_accumulated_memory_stats device_memory_used"
_CUDA_RNG = "get_rng_state set_rng_state get_rng_state_all set_rng_state_all manual_seed manual_seed_all seed seed_all initial_seed"
_CUDA_STREAMS = "Stream Event ExternalStream StreamContext current_stream default_stream set_stream stream " \
    "get_stream_from_external is_current_stream_capturing device device_of"
_CUDA_NO_OP = "init synchronize set_device empty_cache ipc_collect set_sync_debug_mode set_per_process_memory_fraction " \
    "caching_allocator_enable check_error reset_peak_host_memory_stats reset_accumulated_host_memory_stats"
_CUDA_OWN = "CudaError DeferredCudaCallError cudaStatus DEVICE_REQUIREMENT PYTORCH_RELEASES_CODE_CC"
# What a GPU computes or measures that data-less tensors cannot stand for: sensors, allocator internals,
# graph capture, raw handles, the legacy typed tensors and storages.
_CUDA_NOT_SIMULATED = "utilization temperature power_draw clock_rate memory_usage list_gpu_processes memory_snapshot " \
    "host_memory_stats host_memory_stats_as_nested_dict caching_allocator_alloc caching_allocator_delete " \
    "caching_allocator_disabled change_current_allocator CUDAPluggableAllocator MemPool use_mem_pool " \
    "CUDAGraph graph graph_pool_handle make_graphed_callables GreenContext cudart current_blas_handle " \
    "current_solver_handle default_generators " + " ".join(
        f"{t}{kind}" for t in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
        for kind in ("Tensor", "Storage")) + " ComplexDoubleStorage ComplexFloatStorage"

_CUDA = {PROFILE: _CUDA_PROFILE, MEMORY: _CUDA_MEMORY, RNG: _CUDA_RNG, STREAMS: _CUDA_STREAMS, NO_OP: _CUDA_NO_OP,
         OWN: _CUDA_OWN, NOT_SIMULATED: _CUDA_NOT_SIMULATED}


def _rows(kinds: dict[str, str]) -> dict[str, str]:
    return {name: kind for kind, names in kinds.items() for name in names.split()}


def _part(rows: dict[str, str], module: str) -> dict[str, str]:
    """The rows of torch.cuda that a submodule defines or imports (the same function under its own module)."""
    import importlib

    mod = importlib.import_module(module)
    return {n: k for n, k in rows.items() if n in vars(mod)}


_CUDA_ROWS = _rows(_CUDA)
_ACCELERATOR_ROWS = _rows({
    PROFILE: "is_available current_accelerator device_count current_device_index current_device_idx",
    MEMORY: "memory_allocated max_memory_allocated memory_reserved max_memory_reserved memory_stats get_memory_info "
            "reset_peak_memory_stats reset_accumulated_memory_stats",
    STREAMS: "current_stream set_stream device_index",
    NO_OP: "synchronize set_device_index set_device_idx empty_cache empty_host_cache",
    NOT_SIMULATED: "get_device_capability Graph",
})

# module → public name → how the simulated GPU answers it. One row per name a script can reach.
SURFACE: dict[str, dict[str, str]] = {
    "torch.cuda": _CUDA_ROWS,
    **{m: _part(_CUDA_ROWS, m) for m in ("torch.cuda.random", "torch.cuda.memory", "torch.cuda.graphs", "torch.cuda.streams")},
    # the build's flag, left as this build says (False): a green context is a slice of a GPU's SMs
    "torch.cuda.green_contexts": {**_part(_CUDA_ROWS, "torch.cuda.green_contexts"), "SUPPORTED": NOT_SIMULATED},
    "torch.cuda.amp": _rows({OWN: "autocast GradScaler custom_fwd custom_bwd amp_definitely_not_available"}),
    "torch.cuda.nvtx": _rows({NO_OP: "range_push range_pop range_start range_end mark range"}),
    "torch.accelerator": _ACCELERATOR_ROWS,
    # the same functions and class under torch.accelerator's own modules (torch.accelerator.memory.memory_allocated)
    **{m: _part(_ACCELERATOR_ROWS, m) for m in ("torch.accelerator.memory", "torch.accelerator.graphs")},
    "torch.backends.cuda": _rows({
        PROFILE: "is_built is_flash_attention_available can_use_flash_attention can_use_efficient_attention is_ck_sdpa_available",
        OWN: "preferred_linalg_library preferred_blas_library preferred_rocm_fa_library cublas_workspace_size "
             "cublaslt_workspace_size blas_workspace_size enable_cudnn_sdp cudnn_sdp_enabled enable_flash_sdp flash_sdp_enabled "
             "enable_mem_efficient_sdp mem_efficient_sdp_enabled math_sdp_enabled enable_math_sdp "
             "allow_fp16_bf16_reduction_math_sdp fp16_bf16_reduction_math_sdp_allowed sdp_kernel SDPAParams SDPBackend "
             "cuFFTPlanCacheAttrContextProp cuFFTPlanCache cuFFTPlanCacheManager cuBLASModule matmul cufft_plan_cache",
        NOT_SIMULATED: "can_use_cudnn_attention",
    }),
    # torch.backends.cudnn is a module object of its own (a PropModule): its functions live on `.m`,
    # its flags (enabled, benchmark, deterministic, allow_tf32 ...) are properties of its class.
    "torch.backends.cudnn": _rows({
        PROFILE: "is_available version is_acceptable",
        OWN: "flags set_flags CUDNN_TENSOR_DTYPES ContextProp CudnnModule PropModule enabled benchmark benchmark_limit "
             "deterministic allow_tf32 fp32_precision conv rnn depthwise_kernel",
    }),
    # The build's versions: transformers' is_torch_tf32_available, accelerate and bitsandbytes read
    # torch.version.cuda (None on a CPU-only build) before they ask the device.
    "torch.version": _rows({PROFILE: "cuda", OWN: "__version__ debug git_version hip rocm xpu"}),
}

_ABSENT = object()
ANSWERED = frozenset({PROFILE, MEMORY, RNG, STREAMS, NO_OP})


def not_simulated() -> list[str]:
    """Every name the simulation cannot answer, as `module.name`."""
    return [f"{m}.{n}" for m, rows in SURFACE.items() for n, k in rows.items() if k == NOT_SIMULATED]


def patches(answers: Callable[[str, str], Any], refuse: Callable[[str], Callable[..., Any]]) -> Iterator[tuple[Any, str, Any]]:
    """(owner, name, value) for each row to set while the simulation is on: `answers(module, name)` for
    an answered row, `refuse("module.name")` for a function that is not simulated, and for a class a
    stand-in that refuses to be made (`isinstance` answers as torch's class does). torch's own rows are
    left as they are; a row the installed torch lacks is skipped."""
    import importlib

    for module, rows in SURFACE.items():
        owner = importlib.import_module(module)
        owner = getattr(owner, "m", owner) if module == "torch.backends.cudnn" else owner
        for name, kind in rows.items():
            present = getattr(owner, name, _ABSENT)
            if present is _ABSENT or kind == OWN:
                continue
            if kind in ANSWERED:
                yield owner, name, answers(module, name)
            elif isinstance(present, type):
                yield owner, name, refused_class(present, refuse(f"{module}.{name}"))
            elif callable(present):
                yield owner, name, refuse(f"{module}.{name}")


class _Refused(type):
    """The metaclass of a not-simulated class's stand-in: making one, or calling one of its functions
    (`GreenContext.create`), is refused and named; `isinstance` and `issubclass` answer as the class does."""

    _original: type
    _refuse: Callable[..., Any]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._refuse(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._original)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._original)

    def __getattr__(cls, name: str) -> Any:
        value = getattr(cls._original, name)
        return cls._refuse if callable(value) and not name.startswith("__") else value


def refused_class(original: type, refuse: Callable[..., Any]) -> type:
    """A stand-in for the not-simulated class `original` (torch.cuda.CUDAGraph, MemPool, FloatTensor): a
    CPU-only build's own error ("Tried to instantiate dummy base class CUDAGraph", "Torch not compiled with
    CUDA enabled") would be blamed on the script; the simulation names the class instead."""
    return _Refused(original.__name__, (), {"_original": original, "_refuse": staticmethod(refuse),
                                            "__module__": original.__module__, "__qualname__": original.__qualname__,
                                            "__doc__": original.__doc__})
