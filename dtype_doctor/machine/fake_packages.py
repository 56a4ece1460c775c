"""CUDA-only packages under `--simulate`: the target machine has them, the runner does not.

A script that asks transformers for `attn_implementation="flash_attention_2"` needs the
flash-attn package, which installs only beside a CUDA toolkit; on the runner transformers stops
at load ("the package for FlashAttention2 doesn't seem to be installed") and the GPU's verdict
never comes. While a simulation runs, the packages below are visible as installed, the way
transformers, diffusers and peft look for them: a module spec (`importlib.util.find_spec`), a
distribution with its version (`importlib.metadata.version`, `.metadata`, `packages_distributions()`),
and the names they import. Each fake runs what its package runs on the target, within the limits its
source states, and refuses what it refuses with its own words; what needs the package's own compiled
kernels (a block-diagonal xFormers bias) is refused as not simulated: the call stops the script there and the report's `coverage.not_simulated` names it.

- flash-attn 2 (`flash_attn`, `flash_attn.bert_padding`), version 2.8.3: csrc/flash_attn/flash_api.cpp
  `mha_fwd` / `mha_varlen_fwd` check the GPU ("FlashAttention only supports Ampere GPUs or
  newer.", compute capability 8.0 and up), the dtype ("FlashAttention only support fp16 and bf16
  data type"), q/k/v alike ("query and key must have the same dtype"), the device ("Input tensor
  must be on CUDA device") and the head dim ("FlashAttention forward only supports head dimension
  at most 256"). The attention itself is torch's own flash kernel (`aten._flash_attention_forward`,
  the same algorithm and layout, with its backward), run on the simulated tensors.
- `xformers` (machine/fake_xformers.py).

Packages that cannot be faked at all stay absent, as libraries' availability checks find them on the
runner; a script that imports one stops with its ImportError and the reason named (NOT_FAKED,
`not_simulated`). A package that is really installed is imported as it is: the finder comes after
Python's own.

The fakes exist only while the simulation is armed: nothing is written to site-packages, and
transformers' and diffusers' cached answers (`is_flash_attn_2_available`, `is_kernels_available`,
diffusers' `_xformers_available`, the distribution map, the loaded flash functions) are recomputed on
arming and disarming, so a real run afterwards sees the real machine.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
import types
from typing import Any, Callable, Iterator

from dtype_doctor.machine.fake_package import FakePackage, Refuse

# CUDA-only packages transformers, diffusers, peft, accelerate and trl look for, not faked: (why).
NOT_FAKED = {
    "flash_attn_interface": "FlashAttention-3 (Hopper kernels)",
    # Faking these "installed" changes what libraries do on every run, not only the script's call: transformers'
    # HfDeepSpeedConfig subclasses DeepSpeed's config class, and Trainer imports Liger's patches when it is found.
    # The kernel hub: bitsandbytes and transformers call get_kernel on their own whenever it is installed (a CPU
    # gemm for 4-bit, MoE and FP8 kernels) and fall back when it fails; faked, each such call stopped clean scripts.
    "kernels": "the Hugging Face kernel hub (CUDA kernels fetched from the Hub)",
    "liger_kernel": "Liger Kernel (Triton kernels for CUDA)",
    "deepspeed": "DeepSpeed (CUDA ops, built at install)",
    "apex": "NVIDIA Apex (fused CUDA kernels)",
    "mamba_ssm": "mamba-ssm (selective-scan CUDA kernels)",
    "causal_conv1d": "causal-conv1d (CUDA kernels)",
    "flash_attn_3": "FlashAttention-3 (Hopper kernels)",
}
MIN_CAPABILITY = (8, 0)  # flash_api.cpp: "FlashAttention only supports Ampere GPUs or newer."
# flash-attn's own words (csrc/flash_attn/flash_api.cpp, mha_fwd), raised at the first forward.
FLASH_GPU_ERROR = "FlashAttention only supports Ampere GPUs or newer."
FLASH_DTYPE_ERROR = "FlashAttention only support fp16 and bf16 data type"


def _check(q: Any, k: Any, v: Any) -> None:
    """flash_api.cpp mha_fwd's checks, in its order, with its words."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < MIN_CAPABILITY:
        raise RuntimeError(FLASH_GPU_ERROR)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(FLASH_DTYPE_ERROR)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key must have the same dtype")
    if "cpu" in (q.device.type, k.device.type, v.device.type):  # the simulated GPU's tensors live on the stand-in device
        raise RuntimeError("Input tensor must be on CUDA device")
    if q.shape[-1] > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")


def _attention(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int, dropout_p: float,
               softmax_scale: float | None, causal: bool, return_attn_probs: bool) -> Any:
    import torch

    _check(q, k, v)
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, float(dropout_p), bool(causal),
                                                  False, scale=softmax_scale)
    return (out[0], out[1], None) if return_attn_probs else out[0]


def flash_attn_func(q: Any, k: Any, v: Any, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
                    deterministic: bool = False, return_attn_probs: bool = False) -> Any:
    """flash_attn.flash_attn_interface.flash_attn_func: q (batch, seqlen, heads, head_dim)."""
    return _attention(q, k, v, None, None, q.shape[1], k.shape[1], dropout_p, softmax_scale, causal, return_attn_probs)


def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
                           deterministic: bool = False, return_attn_probs: bool = False, block_table: Any = None) -> Any:
    """flash_attn.flash_attn_interface.flash_attn_varlen_func: q (total_q, heads, head_dim)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), dropout_p, softmax_scale,
                      causal, return_attn_probs)


def flash_attn_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any = None, v: Any = None, rotary_cos: Any = None,
                            rotary_sin: Any = None, cache_seqlens: Any = None, cache_batch_idx: Any = None,
                            cache_leftpad: Any = None, block_table: Any = None, softmax_scale: float | None = None,
                            causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Any = None, num_splits: int = 0,
                            return_softmax_lse: bool = False) -> Any:
    """flash_attn.flash_attn_interface.flash_attn_with_kvcache (decode against a cache): the attention over the cache."""
    return _attention(q, k_cache, v_cache, None, None, q.shape[1], k_cache.shape[1], 0.0, softmax_scale, causal,
                      return_softmax_lse)


def unpad_input(hidden_states: Any, attention_mask: Any, unused_mask: Any = None) -> tuple[Any, Any, Any, int, Any]:
    """flash_attn.bert_padding.unpad_input."""
    import torch
    import torch.nn.functional as F

    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = seqlens.max().item()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: Any, indices: Any, batch: int, seqlen: int) -> Any:
    """flash_attn.bert_padding.pad_input."""
    import torch

    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], device=hidden_states.device, dtype=hidden_states.dtype)
    out[indices] = hidden_states
    return out.view(batch, seqlen, *hidden_states.shape[1:])


def _flash_attn_modules(refuse: Refuse) -> dict[str, dict[str, Any]]:
    kernels = {"flash_attn_func": flash_attn_func, "flash_attn_varlen_func": flash_attn_varlen_func,
               "flash_attn_with_kvcache": flash_attn_with_kvcache}
    return {
        "flash_attn": {"__version__": FLASH_ATTN.version, **kernels},
        # diffusers' attention dispatch imports the autograd halves by name at import time; a call of
        # either is refused by name (the finding lists it), as no kernel is simulated behind them.
        "flash_attn.flash_attn_interface": {**kernels, **{name: refuse(f"flash_attn.flash_attn_interface.{name}")
                                                          for name in ("_wrapped_flash_attn_forward",
                                                                       "_wrapped_flash_attn_backward")}},
        "flash_attn.bert_padding": {"pad_input": pad_input, "unpad_input": unpad_input},
    }


FLASH_ATTN = FakePackage("flash_attn", "flash-attn", "2.8.3", _flash_attn_modules)


def packages() -> tuple[FakePackage, ...]:
    """Every package faked while a simulation runs."""
    from dtype_doctor.machine.fake_xformers import XFORMERS

    return FLASH_ATTN, XFORMERS


def refused_here(name: str) -> Callable[..., Any]:
    """The refusal outside a simulation (a fake used directly): a RuntimeError naming the call."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is not simulated (dtype-doctor --simulate)")

    return refused


class _Distribution(importlib.metadata.Distribution):
    """The installed-package record importlib.metadata reads: METADATA and top_level.txt."""

    def __init__(self, name: str, version: str, top_level: str) -> None:
        self._files = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                       "top_level.txt": f"{top_level}\n"}

    def read_text(self, filename: str) -> str | None:
        return self._files.get(filename)

    def locate_file(self, path: Any) -> Any:
        return path


class _Loader(importlib.abc.Loader):
    def __init__(self, attrs: dict[str, Any], package: bool, refuse: Refuse | None) -> None:
        self.attrs, self.package, self.refuse = attrs, package, refuse

    def create_module(self, spec: Any) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(self.attrs)
        module.__dtype_doctor_fake__ = True  # type: ignore[attr-defined]
        if self.package:
            module.__path__ = []  # type: ignore[attr-defined]
        refuse = self.refuse
        if refuse is not None:  # every other name of the module: importable, refused when called

            def __getattr__(name: str) -> Any:
                if name.startswith("__") and name.endswith("__"):
                    raise AttributeError(name)
                return refuse(f"{module.__name__}.{name}")

            module.__getattr__ = __getattr__  # type: ignore[attr-defined]


class CudaOnlyPackages(importlib.abc.MetaPathFinder):
    """`with CudaOnlyPackages(refuse):` — the fakes importable and installed, the others named, until exit.
    `refuse` makes the callable a not-simulated name becomes (CudaSimulation.refusal: the report names the call)."""

    def __init__(self, refuse: Refuse = refused_here) -> None:
        self.packages = packages()
        self.refuse = refuse
        self.modules: dict[str, dict[str, Any]] = {}
        for fake in self.packages:
            self.modules.update(fake.modules(refuse))
        self.refusing = {fake.top for fake in self.packages if fake.refuses_rest}
        self._imported: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        refusing = fullname.split(".")[0] in self.refusing
        if fullname in self.modules or refusing:
            package = refusing or any(m.startswith(fullname + ".") for m in self.modules)
            self._imported.append(fullname)
            loader = _Loader(self.modules.get(fullname, {}), package, self.refuse if refusing else None)
            return importlib.machinery.ModuleSpec(fullname, loader, is_package=package)
        return None

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> Iterator[Any]:
        for fake in self.packages:
            if context.name is None or _normal(context.name) == _normal(fake.distribution):
                yield _Distribution(fake.distribution, fake.version, fake.top)

    def __enter__(self) -> "CudaOnlyPackages":
        sys.meta_path.append(self)  # after Python's own finders: a package really installed is the real one
        _forget_answers()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [n for n, m in sys.modules.items() if getattr(m, "__dtype_doctor_fake__", False)]:
            del sys.modules[name]
        _forget_answers()


def not_simulated(error: BaseException) -> str:
    """What to add to the script's ImportError of a CUDA-only package the simulation does not fake ("" otherwise)."""
    name = getattr(error, "name", None) if isinstance(error, ImportError) else None
    top = name.split(".")[0] if isinstance(name, str) else None
    if top not in NOT_FAKED:
        return ""
    return (f" ({NOT_FAKED[top]} is a CUDA-only package that --simulate does not simulate: the step past this import "
            "needs a GPU machine with it installed)")


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _forget_answers() -> None:
    """transformers' cached package answers, the flash functions it loaded and diffusers' import-time answers:
    recomputed on the next ask."""
    utils = sys.modules.get("transformers.utils.import_utils")
    for fn in vars(utils).values() if utils is not None else ():
        clear: Callable[[], None] | None = getattr(fn, "cache_clear", None)
        if callable(clear) and getattr(fn, "__module__", "") == utils.__name__:  # type: ignore[union-attr]
            clear()
    flash = sys.modules.get("transformers.modeling_flash_attention_utils")
    if flash is not None and getattr(flash, "_loaded_implementation", None) is not None:
        for name in ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn",
                     "_unpad_fn", "_process_flash_kwargs_fn", "_process_with_kvcache_kwargs_fn"):
            setattr(flash, name, None)
    diffusers = sys.modules.get("diffusers.utils.import_utils")
    ask = getattr(diffusers, "_is_package_available", None)
    for fake in packages() if callable(ask) else ():
        if hasattr(diffusers, f"_{fake.top}_available"):  # diffusers asks once, at its import
            try:
                available, version = ask(fake.top)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - diffusers' own answer stays
                continue
            setattr(diffusers, f"_{fake.top}_available", available)
            setattr(diffusers, f"_{fake.top}_version", version)
