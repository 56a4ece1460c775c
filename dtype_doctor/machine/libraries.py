"""Libraries under `--simulate` that decide by device type: bitsandbytes.

bitsandbytes quantizes a `Params4bit` when it is moved to a device that is not `meta`: on
`meta` it takes the move for an empty initialisation and leaves the weight unquantized. The
simulated CUDA device lives on `meta`, so a 4-bit layer moved to (simulated) CUDA is quantized
here as on a GPU: bitsandbytes' own `_quantize`, whose ops run their registered fake
implementations. Only tensors the script placed on simulated CUDA count; an empty `meta`
initialisation (transformers' `init_empty_weights`) stays as bitsandbytes leaves it.

bitsandbytes picks its native library by `torch.version.cuda` as it imports, which the
simulation answers as a CUDA build's: its `cextension` is imported under the build's own value, so
it loads the library this machine has (its CPU kernels, which the simulated layers run) instead of
failing to open libcudart and logging that on the user's terminal.
"""

from __future__ import annotations

import importlib.machinery
import sys
from typing import Any, Callable

import torch

_MODULE = "bitsandbytes.nn.modules"
_NATIVE = "bitsandbytes.cextension"


def patch_bitsandbytes(on_cuda: Callable[[torch.Tensor], bool], set_attr: Callable[[Any, str, Any], None],
                       build_cuda: str | None = None) -> tuple[Any, ...]:
    """Patch bitsandbytes now if it is imported, else when it is: returns the import hooks to remove.
    `build_cuda` is this build's own `torch.version.cuda`, under which bitsandbytes picks its library."""

    def patch(module: Any) -> None:
        cls = getattr(module, "Params4bit", None)
        if cls is None:
            return
        original = cls.to

        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
            if device is not None and device.type == "meta" and not self.bnb_quantized and on_cuda(self.data):
                return self._quantize(device)
            return original(self, *args, **kwargs)

        set_attr(cls, "to", to)

    return tuple(h for h in (around_import(_NATIVE, lambda: _build_version(build_cuda)), after_import(_MODULE, patch)) if h)


def _build_version(cuda: str | None) -> Any:
    import contextlib

    @contextlib.contextmanager
    def built() -> Any:
        answered = torch.version.cuda
        torch.version.cuda = cuda  # type: ignore[misc]
        try:
            yield
        finally:
            torch.version.cuda = answered  # type: ignore[misc]

    return built()


def after_import(name: str, then: Callable[[Any], None]) -> Any:
    """Run `then(module)` on module `name` now if it is imported, else right after it is: returns the
    import hook to remove from sys.meta_path (or None)."""
    if name in sys.modules:
        then(sys.modules[name])
        return None
    hook = _AfterImport(name, then)
    sys.meta_path.insert(0, hook)
    return hook


def around_import(name: str, context: Callable[[], Any]) -> Any:
    """Run module `name`'s import inside `context()` when it is imported (nothing if it already is):
    returns the import hook to remove from sys.meta_path (or None)."""
    if name in sys.modules:
        return None
    hook = _AfterImport(name, lambda module: None, around=context)
    sys.meta_path.insert(0, hook)
    return hook


class _AfterImport:
    """A meta-path finder that runs `then(module)` right after `name` is imported."""

    def __init__(self, name: str, then: Callable[[Any], None], around: Callable[[], Any] | None = None) -> None:
        self.name = name
        self.then = then
        self.around = around

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then, around = spec.loader, self.then, self.around
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            if around is None:
                original(module)
            else:
                with around():
                    original(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# bitsandbytes' LLM.int8 ops whose outlier count depends on the values (the columns past the threshold).
_OUTLIER_OPS = frozenset({"bitsandbytes::int8_vectorwise_quant", "bitsandbytes::int8_double_quant",
                          "bitsandbytes::int8_mixed_scaled_mm"})


def outlier_columns(func: Any, args: tuple, kwargs: dict, took_size: Callable[[str, int], None]) -> Any:
    """An LLM.int8 op with an outlier threshold on simulated tensors: its fake implementation asks a size that
    depends on the values (`new_dynamic_size`), which tensors without data cannot give; taken as every column
    of the input, the largest the op can give, as every data-dependent size is (machine/stand_ins.py).
    Returns the op's outputs, or NotImplemented when `func` is not one of those ops."""
    if isinstance(func, torch._ops.OpOverloadPacket):  # torch.ops.bitsandbytes.int8_mixed_scaled_mm(...)
        func = func.default
    name = func.name() if isinstance(func, torch._ops.OpOverload) else None
    if name not in _OUTLIER_OPS or not args or not isinstance(args[0], torch.Tensor):
        return NotImplemented
    from torch._library import fake_impl
    from torch._library.simple_registry import singleton

    kernel = singleton.find(name).fake_impl.kernel
    if kernel is None:
        return NotImplemented
    columns = int(args[0].shape[-1])

    class EveryColumn:
        @staticmethod
        def new_dynamic_size(**_: Any) -> int:
            return columns

    took_size(f"{name} (its outlier columns)", columns)
    with fake_impl.set_ctx_getter(EveryColumn):
        return kernel(*args, **kwargs)
