"""`run --simulate --device mps`: the script sees a Mac, its tensors on `mps`, and none of CUDA.

The simulated device is CudaSimulation's (fake tensors on meta, machine/simulate.py): this face
sits in front of it. `.to("mps")`, `device="mps"`, `torch.device("mps")` go to the stand-in as
CUDA's do; what the script reads back (`x.device`, `x.is_mps`) says mps:0;
`torch.backends.mps.is_available()` and `torch.accelerator` answer mps while `torch.cuda.is_available()`
is False; `torch.autocast("mps")` takes float16 and bfloat16 only, as torch's own MPS autocast does.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

MPS = torch.device("mps", 0)
_CUDA = torch.device("cuda", 0)
_GETTERS = {torch._C.TensorBase.__dict__[n]: n for n in ("device", "is_cuda", "is_mps")}
_METHOD_WRAPPER = type(torch._C.TensorBase.__dict__["device"].__get__)


def _read(func: Any) -> str | None:
    """"device", "is_cuda" or "is_mps" when `func` is that property's getter (as machine/simulate.py reads them)."""
    return _GETTERS.get(func.__self__) if type(func) is _METHOD_WRAPPER else None


def _is_mps(x: Any) -> bool:
    if isinstance(x, torch.device):
        return x.type == "mps"
    return isinstance(x, str) and x.split(":")[0] == "mps"


def _to_cuda(x: Any) -> Any:
    return _CUDA if _is_mps(x) else x


def _as_mps(x: Any) -> Any:
    return MPS if isinstance(x, torch.device) and x.type in ("cuda", "meta") else x


class _MpsMode(TorchFunctionMode):
    """mps device arguments become the simulation's CUDA ones; device reads of its tensors say mps."""

    def __init__(self, sim: Any) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = dict(kwargs or {})
        read = _read(func)
        if read is not None:
            t = args[0]
            with torch._C.DisableTorchFunction():
                ours = isinstance(t, torch.Tensor) and t.device.type == "meta" and self.sim.sees_cuda(t)
            if read == "is_mps":
                return ours
            if read == "is_cuda" and ours:
                return False
            out = func(*args, **kwargs)
            return MPS if ours and read == "device" else out
        if func is torch.device:
            return func(*args, **kwargs)  # torch.device("mps") stays the script's own; its uses are rewritten
        if "device" in kwargs:
            kwargs["device"] = _to_cuda(kwargs["device"])
        args = tuple(_to_cuda(a) for a in args)
        return func(*args, **kwargs)


# Answered as a Mac by the face itself.
_KEPT = frozenset({"is_available", "device_count"})


class MpsFace:
    """`with MpsFace(simulation, macos):` inside a running CudaSimulation."""

    def __init__(self, sim: Any, macos: tuple[int, int]) -> None:
        self.sim = sim
        self.macos = macos
        self._mode = _MpsMode(sim)
        self._saved: list[tuple[Any, str, Any]] = []

    def _set(self, owner: Any, name: str, value: Any) -> None:
        if hasattr(owner, name):
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    def __enter__(self) -> "MpsFace":
        macos = self.macos
        mps_backend, accelerator = torch.backends.mps, torch.accelerator
        self._set(mps_backend, "is_available", lambda: True)
        self._set(mps_backend, "is_built", lambda: True)
        self._set(mps_backend, "is_macos_or_newer", lambda major, minor: macos >= (major, minor))
        self._set(mps_backend, "is_macos13_or_newer", lambda minor=0: macos >= (13, minor))
        self._set(torch.cuda, "is_available", lambda: False)  # a Mac has no CUDA
        self._set(torch.cuda, "device_count", lambda: 0)
        self._set(accelerator, "is_available", lambda: True)
        self._set(accelerator, "current_accelerator", lambda check_available=False: torch.device("mps"))
        self._set(accelerator, "device_count", lambda: 1)
        for name in ("synchronize", "empty_cache", "manual_seed", "seed"):
            self._set(torch.mps, name, lambda *a, **k: None)
        self._patch_autocast()
        self._no_cuda_build()
        self._mode.__enter__()
        return self

    def _no_cuda_build(self) -> None:
        """What the script asks of CUDA is a Mac's torch's answer (no CUDA in the build: torch.version.cuda None,
        is_bf16_supported False, get_device_name raising "Torch not compiled with CUDA enabled"), which is this
        CPU-only build's own: the simulation's answers (and refusals) for the GPU it runs the Mac on are put back to those."""
        from dtype_doctor.machine.cuda_api import OWN, SURFACE

        asked = {(m, n) for m, rows in SURFACE.items() for n, k in rows.items()
                 if k != OWN and not (m == "torch.cuda" and n in _KEPT) and not m.startswith("torch.accelerator")}
        by_module = {id(__import__("importlib").import_module(m)): m for m, _ in asked}
        cudnn = torch.backends.cudnn
        by_module[id(getattr(cudnn, "m", cudnn))] = "torch.backends.cudnn"
        for owner, name, original in self.sim.patches.saved():
            if (by_module.get(id(owner)), name) in asked:
                self._set(owner, name, original)

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()

    def _patch_autocast(self) -> None:
        """torch.autocast("mps"): torch/amp/autocast_mode.py's MPS branch (float16/bfloat16 only,
        bfloat16 from macOS 14, else a warning and no autocast), then the simulated CUDA autocast."""
        from torch.amp import autocast_mode

        from dtype_doctor.machine.mps_expectations import BF16_SINCE

        cls = autocast_mode.autocast
        inner = cls.__init__
        macos = self.macos

        def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                     cache_enabled: bool | None = None) -> None:
            if device_type == "mps":
                dtype = dtype if dtype is not None else torch.float16
                if enabled and dtype not in (torch.float16, torch.bfloat16):
                    warnings.warn("In MPS autocast, but the target dtype is not supported. Disabling autocast.\n"
                                  "MPS Autocast only supports dtype of torch.bfloat16 and torch.float16 currently.", stacklevel=2)
                    enabled = False
                elif enabled and dtype == torch.bfloat16 and macos < BF16_SINCE:
                    warnings.warn("In MPS autocast, but the target dtype torch.bfloat16 is not supported on macOS "
                                  "versions below 14. Disabling autocast.", stacklevel=2)
                    enabled = False
                device_type = "cuda"
            inner(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self._set(cls, "__init__", __init__)
