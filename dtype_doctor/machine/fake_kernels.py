"""`kernels` (the Hugging Face kernel hub) under `--simulate`, as the target machine has it installed.

transformers decides with `is_kernels_available()` (utils/import_utils.py:807-814: the package's spec
and a version with KERNELS_MIN_VERSION <= v < KERNELS_MAX_VERSION, "0.18.2" and "0.19.0" at :177-178),
then imports from it the names integrations/hub_kernels.py:84-101 lists. Its model classes are decorated
at import (`@use_kernel_forward_from_hub("RMSNorm")`, `@use_kernelized_func(apply_rotary_pos_emb)`),
so the decorators run as kernels' own do (huggingface/kernels kernels/src/kernels/layer/layer.py:252-415
and :612-632): a class gets `kernel_layer_name` and keeps its forward, a function becomes a layer
(an `nn.Module` whose forward calls it), a class using kernel functions keeps them in `_kernel_funcs`.
Nothing is replaced until `kernelize`. The repository records and device properties check what theirs
check (layer.py:69-90, layer/device.py, layer/mode.py).

What needs a kernel itself is refused as not simulated: `get_kernel`, `load_kernel`, `has_kernel`,
`kernelize` (a kernel built for CUDA is fetched from the Hub and loaded; a simulated GPU has neither the
network nor the device code). transformers reaches them for `from_pretrained(..., use_kernels=True)`,
`attn_implementation="kernels-community/..."` and its lazily loaded kernels (MoE, FP8, NVFP4); the
report names the call.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from dtype_doctor.machine.fake_package import FakePackage, Refuse

VERSION = "0.18.2"  # transformers' KERNELS_MIN_VERSION, the version its message asks to install


@dataclass(frozen=True)
class CUDAProperties:
    """layer/device.py CUDAProperties: capabilities as integers (75 for 7.5)."""

    min_capability: int
    max_capability: int

    def validate_capability_range(self) -> None:
        if self.min_capability > self.max_capability:
            raise ValueError(f"min_capability ({self.min_capability}) must be <= max_capability ({self.max_capability})")


@dataclass(frozen=True)
class ROCMProperties(CUDAProperties):
    """layer/device.py ROCMProperties."""


@dataclass(frozen=True)
class Device:
    """layer/device.py Device, with its checks."""

    type: str
    properties: CUDAProperties | None = None

    def __post_init__(self) -> None:
        if isinstance(self.properties, ROCMProperties):
            if self.type != "rocm":
                raise ValueError("ROCMProperties is only supported for 'rocm' devices.")
        elif isinstance(self.properties, CUDAProperties) and self.type != "cuda":
            raise ValueError("CUDAProperties is only supported for 'cuda' devices.")


class Mode(enum.Flag):
    """layer/mode.py Mode, with its exclusions."""

    _NONE = 0
    FALLBACK = enum.auto()
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()

    def __or__(self, other: "Mode") -> "Mode":  # type: ignore[override]
        union = super().__or__(other)
        if Mode.INFERENCE in union and Mode.TRAINING in union:
            raise ValueError("Mode.INFERENCE and Mode.TRAINING are mutually exclusive.")
        if Mode.FALLBACK in union and union != Mode.FALLBACK:
            raise ValueError("Mode.FALLBACK cannot be combined with other modes.")
        return union


class KernelizeFallback(enum.Flag):
    """What `kernelize` keeps when no kernel fits (transformers passes KernelizeFallback.ALL, hub_kernels.py:961)."""

    NONE = 0
    MODE = enum.auto()
    DEVICE = enum.auto()
    ALL = MODE | DEVICE


class LayerRepository:
    """layer.py:69-90: a kernel layer on the Hub, by revision or version (resolved lazily there, never here)."""

    def __init__(self, repo_id: str, *, layer_name: str, revision: str | None = None, version: int | None = None,
                 trust_remote_code: bool | list[str] = False) -> None:
        if revision is not None and version is not None:
            raise ValueError("Either a revision or a version must be specified, not both.")
        if revision is None and version is None:
            raise ValueError("Either a revision or a version must be specified.")
        self.repo_id, self.layer_name, self.revision, self.version = repo_id, layer_name, revision, version
        self.trust_remote_code = trust_remote_code


class LocalLayerRepository:
    """layer.py LocalLayerRepository: a kernel layer in a local directory."""

    def __init__(self, repo_path: Any, *, package_name: str, layer_name: str) -> None:
        self.repo_path, self.package_name, self.layer_name = repo_path, package_name, layer_name


FuncRepository = LayerRepository
LocalFuncRepository = LocalLayerRepository


def replace_kernel_forward_from_hub(cls: type, layer_name: str) -> None:
    """layer.py:252-272."""
    cls.kernel_layer_name = layer_name  # type: ignore[attr-defined]


def _func_module(func: Callable[..., Any]) -> type:
    """layer.py:612-632: a function as a layer whose forward calls it."""
    from torch import nn

    class Func(nn.Module):
        can_torch_compile = getattr(func, "can_torch_compile", False)
        has_backward = getattr(func, "has_backward", True)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    signature = inspect.signature(func)
    Func.forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *signature.parameters.values()])
    return Func


def use_kernel_forward_from_hub(layer_name: str) -> Callable[[Any], Any]:
    """layer.py:275-344: a class is marked and kept; a function becomes a layer instance."""

    def decorator(ty: Any) -> Any:
        if inspect.isfunction(ty):
            func = _func_module(ty)
            replace_kernel_forward_from_hub(func, layer_name)
            return func()
        if inspect.isclass(ty):
            replace_kernel_forward_from_hub(ty, layer_name)
            return ty
        raise TypeError("@use_kernel_forward_from_hub can only be applied to classes or functions")

    return decorator


def use_kernelized_func(*funcs: Callable[..., Any]) -> Callable[[type], type]:
    """layer.py:347-415: the kernel functions kept on each instance, as plain attributes (not submodules)."""

    def decorator(cls: type) -> type:
        for fn in funcs:
            if not hasattr(fn, "kernel_layer_name"):
                raise ValueError(f"Function `{fn.__name__}` is not decorated with @use_kernel_forward_from_hub and "
                                 "cannot be used with @use_kernelized_func")
        original = cls.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            hidden = self.__dict__.setdefault("_kernel_funcs", {})
            for fn in funcs:
                hidden[getattr(fn, "__name__", None) or fn.kernel_layer_name] = fn  # type: ignore[attr-defined]

        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorator


class _Mapping:
    """use_kernel_mapping(...): a context that registers nothing a simulation could use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _register_kernel_mapping(mapping: Any, *, inherit_mapping: bool = True) -> None:
    """kernelize.py register_kernel_mapping: kept by kernels for `kernelize`, which is not simulated."""


def _modules(refuse: Refuse) -> dict[str, dict[str, Any]]:
    names = {
        "__version__": VERSION, "CUDAProperties": CUDAProperties, "ROCMProperties": ROCMProperties, "Device": Device,
        "Mode": Mode, "KernelizeFallback": KernelizeFallback, "LayerRepository": LayerRepository,
        "LocalLayerRepository": LocalLayerRepository, "LockedLayerRepository": LayerRepository,
        "FuncRepository": FuncRepository, "LocalFuncRepository": LocalFuncRepository,
        "LockedFuncRepository": FuncRepository, "replace_kernel_forward_from_hub": replace_kernel_forward_from_hub,
        "use_kernel_forward_from_hub": use_kernel_forward_from_hub, "use_kernel_func_from_hub": use_kernel_forward_from_hub,
        "use_kernelized_func": use_kernelized_func, "use_kernel_mapping": _Mapping,
        "register_kernel_mapping": _register_kernel_mapping,
        **{name: refuse(f"kernels.{name}") for name in ("get_kernel", "get_local_kernel", "get_locked_kernel", "has_kernel",
                                                       "load_kernel", "install_kernel", "kernelize")},
    }
    return {"kernels": names, "kernels.layer": dict(names), "kernels.layer.mode": {"Mode": Mode},
            "kernels.layer.device": {"Device": Device, "CUDAProperties": CUDAProperties, "ROCMProperties": ROCMProperties}}


KERNELS = FakePackage("kernels", "kernels", VERSION, _modules, refuses_rest=True)
