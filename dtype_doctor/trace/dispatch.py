"""The two torch modes that hand each op to the Recorder (trace/recorder.py).

The dispatch mode sees every aten op with its real operands, after autocast's casts; a library
tensor subclass's own ops are seen too. The function mode sees the few torch functions whose
checks run before dispatch (SDPA validates its mask in C++ before any aten op is called) and,
with CUDA autocast emulated or a simulated target, applies autocast's casts and opens torch's
Python functions so the ops they call are seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from dtype_doctor.machine.gpus import capability_of
from dtype_doctor.records import FP16_MAX, OpCall
from dtype_doctor.trace.opfacts import facts
from dtype_doctor.trace.sdpa_route import fused_run
from dtype_doctor.trace.subclass import wrapper_type

if TYPE_CHECKING:
    from dtype_doctor.trace.recorder import Recorder

# The doctor's own reads of tensor metadata with torch functions off: no function mode sees them.
NoTorchFunction = torch._C.DisableTorchFunction


# Functions whose dtype checks run before dispatch: conv checks input/bias types, SDPA
# validates its mask, take_along_dim its indices and cross_entropy a probability target
# in composite C++ before any aten op is called.
_CONV_ARGS = ("input", "weight", "bias")
_FUNCTIONS_TO_WATCH = {
    torch.take_along_dim: ("torch.take_along_dim", ("input", "indices")),
    torch.nn.functional.cross_entropy: ("torch.nn.functional.cross_entropy", ("input", "target")),
    torch.nn.functional.scaled_dot_product_attention: (
        "torch.nn.functional.scaled_dot_product_attention",
        ("query", "key", "value", "attn_mask"),
    ),
    **{
        getattr(torch, name): (f"torch.{name}", _CONV_ARGS)
        for name in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
    },
    torch.max_pool1d: ("torch.max_pool1d", ("input",)),
    torch.nn.functional.max_pool1d: ("torch.nn.functional.max_pool1d", ("input",)),
    # quantile refuses half precision in composite C++ before any aten op runs (DD112).
    **{f: (f"torch.{f.__name__}", ("input", "q")) for f in (torch.quantile, torch.nanquantile, torch.Tensor.quantile, torch.Tensor.nanquantile)},
}
# Functions whose C++ takes another kernel path while any dispatch mode is on (ATen treats
# a mode as a tensor subclass): max_pool1d's mode-free CPU path (max_pool1d_impl) has no
# integer kernel, the with-indices path it takes under the recorder has. A real trace also
# runs them once outside every mode, for the error the user's own call would raise.
_MODE_DEPENDENT = frozenset({torch.max_pool1d, torch.nn.functional.max_pool1d})

# Operand types that are never a Python number (a number's own subclass, numpy.float64, is not here).
NEVER_NUMBERS = frozenset({torch.Tensor, torch.nn.Parameter, list, tuple, type(None), bool, str, torch.dtype, torch.device, torch.Size})


def big_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) > FP16_MAX


class DispatchRecorder(TorchDispatchMode):
    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        rec = self.rec
        if rec.writes is not None:
            rec.writes.before(func, args, kwargs)
        if rec._suspended:
            return func(*args, **kwargs)
        if rec.shared and (shared := rec.shared_run(func, args, kwargs))[0]:
            return shared[1]  # an op of a layer identical to one traced (trace/layer_share.py)
        if rec._unkept is not None and rec._in_root and rec.predict is None and rec.amp is None and rec.writes is None:
            # Inside a model's repeated call, whose ops are dropped: run as is; only an op that raises
            # goes through record() below, to be repaired as the first call's was.
            try:
                return func(*args, **kwargs)
            except Exception:  # noqa: BLE001 - recorded and repaired (or raised) below
                pass
        name = facts(func).name
        wrapper = wrapper_type(types)
        if wrapper is None:
            outputs = rec.meta_outputs
            run = (lambda a, k: func(*a, **k)) if outputs is None else (lambda a, k: outputs.run(func, a, k))
            return rec.record(func, name, args, kwargs, run, "aten")

        # A library's tensor subclass (torchao's Float8TrainingTensor) runs its own ops on the plain
        # tensors it wraps (aten.mm becomes torch._scaled_mm): its handler runs with this mode
        # pushed again — the dispatcher pops it for the handler — so those ops are recorded too.
        def inside(a: tuple, k: dict) -> Any:
            with self:
                return wrapper.__torch_dispatch__(func, types, a, k)

        return self.rec.record(func, name, args, kwargs, inside, "aten")


class FunctionRecorder(TorchFunctionMode):
    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec
        self._opening: set[Any] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        rec = self.rec
        if rec.amp is None and rec.predict is None and func not in _FUNCTIONS_TO_WATCH and func is not _SETITEM:
            return func(*args, **kwargs)  # a real trace without emulated autocast: most functions pass straight on
        amp = self.rec.amp if not self.rec._suspended else None
        if amp is not None:
            self.rec.amp_state = amp.current()
        if amp is not None and amp.enabled:
            refusal = amp.refusal(func, args, kwargs)
            if refusal is not None:
                return self._refused_by_autocast(func, args, kwargs, refusal)
            self.rec._suspended += 1  # autocast's casts are not the model's ops
            try:
                args, kwargs = amp.cast(func, args, kwargs)
            finally:
                self.rec._suspended -= 1
        watched = _FUNCTIONS_TO_WATCH.get(func)
        if watched is None and func is torch.Tensor.__setitem__ and len(args) == 3 and big_number(args[2]):
            # `scores[...] = 2**30`: the number becomes a half tensor (inf) before dispatch.
            watched = ("torch.Tensor.__setitem__", ("self", "key", "value"))
        if watched is None:
            simulated = self.rec.predict is not None and not self.rec._suspended
            if func is torch.Tensor.__bool__ and simulated:
                return self._assumed_condition(func, args, kwargs)
            if rec.shared and not (amp is not None and amp.enabled):
                return func(*args, **kwargs)  # a shared layer's: nothing inside it is recorded
            if ((amp is not None and amp.enabled) or simulated) and func not in _SHOWN:
                return self._opened(func, args, kwargs)
            return func(*args, **kwargs)
        name, arg_names = watched
        run = _eager_checked(func) if func in _MODE_DEPENDENT and self.rec.predict is None else (lambda a, k: func(*a, **k))
        if func is _SDPA and getattr(rec.predict, "cuda", False):  # the kernel the GPU picks (trace/sdpa_route.py)
            run = fused_run(args, kwargs, capability_of(rec.predict.gpu)) or run
        return self.rec.record(_FunctionSchema(arg_names, func), name, args, kwargs, run, "function")

    def _opened(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run a Python-level torch function with this mode on inside it.

        A mode is off while its handler runs, so the torch functions that F.multi_head_attention_forward
        (or F.softmax, torch.einsum …) calls would pass unseen: CUDA autocast's casts, the watched
        functions' checks and, in a simulated trace, the value conditions fake tensors cannot
        decide (F.gaussian_nll_loss's `torch.any(var < 0)`). The function's own code runs with its
        has_torch_function checks answering False (else it would hand itself straight back here)
        and the mode on for everything it calls.
        """
        opened = _transparent(func) if func not in self._opening else None
        if opened is None:
            return func(*args, **kwargs)
        self._opening.add(func)
        try:
            with self:
                return opened(*args, **kwargs)
        finally:
            self._opening.discard(func)

    def _assumed_condition(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`if torch.any(var < 0): raise ...` on fake tensors, which hold no values: the condition
        is taken as False (the path of valid inputs in torch's own checks) and the assumption
        recorded, instead of ending the simulated trace (DD001 reports it)."""
        from torch._subclasses.fake_tensor import DataDependentOutputException

        try:
            return func(*args, **kwargs)
        except DataDependentOutputException:
            rec = self.rec
            module, module_type = rec.stack[-1]
            operands = tuple(rec.meta(t) for t in args if isinstance(t, torch.Tensor))
            autocast = rec.amp_state if rec.amp is not None else rec.autocast_stack[-1]
            rec.ops.append(
                OpCall(len(rec.ops), "torch.Tensor.__bool__", module, module_type, operands, (), "forward", autocast,
                       None, False, "function", (("assumed", False),))
            )
            return False

    def _refused_by_autocast(self, func: Any, args: tuple, kwargs: dict, refusal: str) -> Any:
        """An op CUDA autocast refuses outright (binary_cross_entropy): recorded with CUDA's
        error, then run as the fix would run it (in float32, outside autocast) so the trace goes on."""
        from dtype_doctor.trace.cuda_autocast import to_float32

        def run(a: tuple, k: dict) -> Any:
            self.rec._suspended += 1
            try:
                a, k = to_float32(a, k)
            finally:
                self.rec._suspended -= 1
            with self.rec.amp.disabled():
                return func(*a, **k)

        short = getattr(func, "__name__", "function")
        name = f"torch.nn.functional.{short}" if short == "binary_cross_entropy" else f"torch.{short}"
        arg_names = ("input", "target", "weight") if short == "binary_cross_entropy" else ()
        return self.rec.record(_FunctionSchema(arg_names), name, args, kwargs, run, "function", refusal=refusal)


_SETITEM = torch.Tensor.__setitem__
_SDPA = torch.nn.functional.scaled_dot_product_attention
# How a tensor is printed: no op of the step's, and the simulation below answers it with the device the script
# sees (`print(logits)` reads cuda:0, never the meta stand-in), so it is handed on, not opened.
_SHOWN = frozenset({torch.Tensor.__repr__, torch.Tensor.__format__})
_HAS_TORCH_FUNCTION = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_TRANSPARENT: dict[Any, Any] = {}


def _never(*args: Any) -> bool:
    return False


def _transparent(func: Any) -> Any:
    """`func` (a Python function of torch) with its has_torch_function checks answering False, or None."""
    import types

    if func in _TRANSPARENT:
        return _TRANSPARENT[func]
    opened = None
    code = getattr(func, "__code__", None)
    if (
        isinstance(func, types.FunctionType)
        and (func.__module__ or "").startswith("torch")
        and code is not None
        and any(n in code.co_names for n in _HAS_TORCH_FUNCTION)
    ):
        scope = dict(func.__globals__)
        scope.update({n: _never for n in _HAS_TORCH_FUNCTION})
        opened = types.FunctionType(code, scope, func.__name__, func.__defaults__, func.__closure__)
        opened.__kwdefaults__ = func.__kwdefaults__
    _TRANSPARENT[func] = opened
    return opened


def _eager_checked(func: Any) -> Callable[[tuple, dict], Any]:
    def run(args: tuple, kwargs: dict) -> Any:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes(), torch.no_grad():
            func(*args, **kwargs)  # raises what the user's call raises
        return func(*args, **kwargs)

    return run


class _FunctionSchema:
    """Gives a watched torch function the `_schema.arguments` shape aten ops have; `function`
    is the torch function itself (a simulated trace's probe runs it on real CPU tensors)."""

    def __init__(self, names: tuple[str, ...], function: Any = None) -> None:
        self._schema = self
        self.arguments = tuple(_Arg(n) for n in names)
        self.function = function

    def __hash__(self) -> int:
        return hash(tuple(a.name for a in self.arguments))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FunctionSchema) and hash(self) == hash(other)

    def __str__(self) -> str:
        return ",".join(a.name for a in self.arguments)


@dataclass(frozen=True, slots=True)
class _Arg:
    name: str
