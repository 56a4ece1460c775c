"""Simulated verdicts from real kernels: run each new op signature once on small CPU tensors.

Fake tensors carry dtypes but run no kernels, so they accept what real kernels refuse
(`sub` with bool, integer `gelu`, mixed-dtype `scatter`). For every distinct signature in a
simulated trace — the op, each operand's dtype, rank and role, and the non-tensor arguments
that select a kernel — the probe runs the op once for real on CPU tensors of the same dtypes
(the recorded shapes when small, else shrunk consistently: equal sizes stay equal, index
values stay in range), and the CPU↔CUDA table turns the CPU verdict into the target's.
The torch functions whose checks run before dispatch (conv, SDPA, cross_entropy,
take_along_dim, max_pool1d) are probed the same way, by calling the function. A probe that
cannot run (a shape the shrinking broke, a value-dependent kernel) decides nothing; the
rules' own judgement stands in for it.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from dtype_doctor.records.errors import first_line
from dtype_doctor.records import DTYPE_MAX, OpCall, dtype_name
from dtype_doctor.machine.gpus import GpuProfile
from dtype_doctor.trace.dispatch import _MODE_DEPENDENT
from dtype_doctor.trace.verdicts import classify_error, unsupported_dtype

_UNDECIDED = object()
_DEFERRED = object()  # a torch function whose refusal comes from one of its own aten ops
_NO_CPU_KERNEL = object()  # an op this CPU build has no kernel for at all
_SMALL = 1 << 16  # elements: tensors up to this size are probed at their recorded shape
_FLOATING_FILL = 0.5  # in the domain of log, sqrt, acos …; integers are 0, a valid index


class KernelProbe:
    """`probe(func, args, kwargs, op)` → PyTorch's refusal for the target device, or None."""

    def __init__(self, *, cuda: bool, gpu: GpuProfile | None = None, fallback: Callable[[OpCall], str | None] | None = None) -> None:
        self.cuda = cuda
        self.gpu = gpu
        self.fallback = fallback
        self.cache: dict[tuple, Any] = {}
        self.accepted_on_cuda: set[tuple] = set()  # signatures whose CPU verdict CUDA accepts too
        self.counts: Counter = Counter()  # probes run, cache hits, undecided
        self.last_accepted = False  # the last call's real kernel ran the op
        self.last_output_dtypes: tuple[torch.dtype, ...] | None = None  # and the dtypes of its tensor outputs
        self._output_dtypes: dict[tuple, tuple[torch.dtype, ...]] = {}
        self._ran_outputs: tuple[torch.dtype, ...] | None = None  # the last _run's, when its kernel ran

    def __call__(self, func: Any, args: tuple, kwargs: dict, op: OpCall) -> str | None:
        self.last_accepted = False
        self.last_output_dtypes = None
        if self.cuda and (refusal := index_device_refusal(op) or matmul_device_refusal(op)) is not None:
            return refusal
        if self.cuda and isinstance(func, torch._ops.OpOverload):
            # A backward reads what its forward saved, in the dtype CUDA's forward saved it.
            refusal, args, kwargs = self._as_cpu_saved(func, args, kwargs)
            if refusal is not None:
                return refusal
        # A torch function the recorder watches (conv, SDPA, cross_entropy …) checks dtypes in
        # C++ before any aten op: run the function itself.
        function = getattr(func, "function", None)
        if function is not None:
            func = function
        elif not isinstance(func, torch._ops.OpOverload) or _metadata_only(func):
            return self.fallback(op) if self.fallback and not isinstance(func, torch._ops.OpOverload) else None
        key = _signature(func, args, kwargs)
        verdict = self.cache.get(key, _UNDECIDED)
        if verdict is _UNDECIDED and key not in self.cache:
            self.counts["probes"] += 1
            self._ran_outputs = None
            verdict = self._run(func, args, kwargs)
            self.cache[key] = verdict
            if self._ran_outputs is not None:
                self._output_dtypes[key] = self._ran_outputs
        else:
            self.counts["cached"] += 1
        if verdict is _DEFERRED:
            return None  # the function's own aten ops are probed as they run
        if verdict is _NO_CPU_KERNEL:
            # A CUDA-only op (flash attention): only op_db's CUDA list can judge it.
            if not self.cuda:
                return None
            from dtype_doctor.trace.cuda_table import on_cuda

            return on_cuda(op.op, op.operands, None, None, self.gpu, cpu_kernel=False)
        if verdict is _UNDECIDED:
            self.counts["undecided"] += 1
            return self.fallback(op) if self.fallback else None
        self.last_accepted = verdict is None
        self.last_output_dtypes = self._output_dtypes.get(key)
        if not self.cuda:
            return verdict
        # CUDA's acceptance reads the operands' dtypes, roles, devices and which are 0-dim (never
        # their names or sizes): the layers of a deep model ask it the same question each time.
        accepted_key = (key, op.op, tuple((t.dtype, t.role, t.device, t.is_scalar) for t in op.operands))
        if accepted_key in self.accepted_on_cuda:
            return None
        from dtype_doctor.trace.cuda_table import on_cuda

        unsupported = unsupported_dtype(verdict, op.operands) if verdict else None
        refusal = on_cuda(op.op, op.operands, verdict, unsupported, self.gpu)
        if refusal is None:
            self.accepted_on_cuda.add(accepted_key)
        return refusal

    def as_made(self, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        """A forward's outputs as the target's kernel makes them: the tensors a CUDA forward saves
        for its backward in CUDA's dtype where the fake kernel made another (weight_norm's float16
        norms; CUDA's are float32: trace/cuda_table.py SAVED_FOR_BACKWARD)."""
        if not self.cuda or not isinstance(out, tuple):
            return out
        from dtype_doctor.trace.cuda_table import saved_by_forward

        entry = saved_by_forward(getattr(func, "_opname", ""))
        if entry is None:
            return out
        reference = _named(func, args, kwargs).get(entry.reference[0])
        if not isinstance(reference, torch.Tensor) or not reference.is_floating_point():
            return out
        want = getattr(torch, entry.cuda(dtype_name(reference.dtype)))
        made = list(out)
        for i in entry.outputs:
            t = made[i] if i < len(made) else None
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != want:
                with torch._C.DisableTorchFunction():
                    made[i] = t.to(want)
        return tuple(made)

    def _as_cpu_saved(self, func: Any, args: tuple, kwargs: dict) -> tuple[str | None, tuple, dict]:
        """A backward given the tensors its CUDA forward saved (trace/cuda_table.py SAVED_FOR_BACKWARD):
        CUDA's refusal when they are not of CUDA's dtype; else the arguments with them in the dtype
        this CPU's forward saves for the same operands, so the CPU kernel is asked CUDA's question."""
        from dtype_doctor.trace.cuda_table import saved_for_backward, saved_refusal

        entry = saved_for_backward(func._opname)
        if entry is None:
            return None, args, kwargs
        named = _named(func, args, kwargs)
        dtypes = {k: dtype_name(v.dtype) for k, v in named.items() if isinstance(v, torch.Tensor)}
        refusal = saved_refusal(entry, dtypes)
        if refusal is not None:
            return refusal, args, kwargs
        cpu = self._cpu_saved_dtypes(entry, named)
        if cpu is None:
            return None, args, kwargs
        present = [n for n in entry.arguments if isinstance(named.get(n), torch.Tensor)]
        with _disable_current_modes():
            for name, dtype in zip(present, cpu):
                t = named[name]
                if t.dtype != dtype:
                    named[name] = torch.empty(tuple(t.shape), dtype=dtype, device="meta")
        return None, *_unnamed(func, named, len(args))

    def _cpu_saved_dtypes(self, entry: Any, named: dict[str, Any]) -> tuple[torch.dtype, ...] | None:
        """The dtypes this CPU's forward saves `entry.outputs` in, for the forward operands `named`
        stands for (the forward run once on small tensors, per signature); None when it cannot run."""
        forward = getattr(torch.ops.aten, entry.cpu_forward).default
        try:
            arguments = entry.cpu_arguments(named)
        except KeyError:
            return None
        key = ("saved", _signature(forward, arguments, {}))
        found = self.cache.get(key, _UNDECIDED)
        if found is _UNDECIDED:
            found = None
            with _disable_current_modes(), torch._C._DisablePythonDispatcher(), torch.no_grad():
                try:
                    out = forward(*_materialise(arguments, _shrinker([t for t in _flat(arguments) if isinstance(t, torch.Tensor)])))
                    found = tuple(out[i].dtype for i in entry.outputs)
                except Exception:  # noqa: BLE001 - a forward the CPU refuses decides nothing here
                    found = None
            self.cache[key] = found
        return found

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        tensors = [t for t in _flat(args, kwargs) if isinstance(t, torch.Tensor)]
        shrink = _shrinker(tensors) if sum(t.numel() for t in tensors) > _SMALL else None
        # Outside every mode, and outside the Python dispatcher fake tensors turn on (which
        # would run Python decompositions instead of the CPU kernel).
        with _disable_current_modes(), torch._C._DisablePythonDispatcher(), torch.no_grad():
            try:
                real_args, real_kwargs = _materialise((args, kwargs), shrink, _int_fill(func))
            except Exception:  # noqa: BLE001 - a shape we cannot rebuild decides nothing
                return _UNDECIDED
            # A torch function's refusal raised by one of its aten ops is that op's to report,
            # where the recorder meets it (cross_entropy's integer targets are nll_loss's).
            inner = _InFlight() if not isinstance(func, torch._ops.OpOverload) and func not in _MODE_DEPENDENT else None
            try:
                with inner if inner is not None else contextlib.nullcontext():
                    out = func(*real_args, **real_kwargs)
            except Exception as exc:  # noqa: BLE001 - the verdict is what the kernel says
                message = first_line(exc, 500)
                if message.startswith("Could not run") and "'CPU' backend" in message:
                    return _NO_CPU_KERNEL
                if classify_error(message, ()) in ("dtype", "overflow") or isinstance(exc, NotImplementedError):
                    return _DEFERRED if inner is not None and inner.raised else message
                return _UNDECIDED
        self._ran_outputs = tuple(t.dtype for t in _flat(out) if isinstance(t, torch.Tensor))
        return None


class _InFlight(TorchDispatchMode):
    """Notes whether an exception left an aten op (else it came from checks before dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.raised = True
            raise


def _named(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An aten op's arguments by their schema names."""
    named = dict(kwargs)
    for argument, value in zip(func._schema.arguments, args):
        named[argument.name] = value
    return named


def _unnamed(func: Any, named: dict[str, Any], positional: int) -> tuple[tuple, dict]:
    """`_named` undone: the first `positional` arguments by position, the rest by keyword."""
    names = [a.name for a in func._schema.arguments]
    return tuple(named[n] for n in names[:positional]), {n: v for n, v in named.items() if n not in names[:positional]}


def _metadata_only(func: Any) -> bool:
    """Views, copies and factories never refuse a dtype."""
    if getattr(func, "is_view", False):
        return True
    name = func.__name__.split(".")[0]
    return name in _AGNOSTIC


_AGNOSTIC = frozenset(
    {"_to_copy", "copy_", "clone", "detach", "alias", "lift_fresh", "lift_fresh_copy", "empty", "empty_like",
     "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
     "full_like", "arange", "scalar_tensor", "_local_scalar_dense", "contiguous", "sym_size", "sym_stride",
     "sym_numel", "sym_storage_offset", "_unsafe_view", "set_", "resize_", "new_zeros", "new_ones", "new_full"}
)



def index_device_refusal(op: OpCall) -> str | None:
    """CUDA's refusal of an embedding / index_select whose table and index sit on two devices; meta kernels
    check no devices here. CUDA's index_select refuses a CPU index (seen on an H100), and a CUDA index into a
    CPU table (a model left on the CPU, fed the GPU batch) as any op on two devices (the generated wrapper's
    check_and_update_common_device), where a meta index into a CPU table returns uninitialised CPU values."""
    if op.op.split(".")[:2] not in (["aten", "embedding"], ["aten", "index_select"]):
        return None
    gpu = next((t.device for t in op.operands if t.role != "index" and t.device != "cpu"), None)
    if gpu is not None and any(t.role == "index" and t.device == "cpu" and not t.is_scalar for t in op.operands):
        # meta:k stands for cuda:k (several GPUs); a bare meta is named by machine/wording.py
        where = f"cuda:{gpu.split(':')[1]}" if gpu.startswith("meta:") else gpu
        return (f"Expected all tensors to be on the same device, but got index is on cpu, different from other "
                f"tensors on {where}" + _wrapper(where, " (when checking argument in method wrapper_CUDA__index_select)"))
    index = next((t.device for t in op.operands if t.role == "index" and t.device != "cpu" and not t.is_scalar), None)
    if index is not None and any(t.role != "index" and t.device == "cpu" and not t.is_scalar for t in op.operands):
        where = f"cuda:{index.split(':')[1]}" if index.startswith("meta:") else index
        return (f"Expected all tensors to be on the same device, but found at least two devices, cpu and {where}!"
                + _wrapper(where, " (when checking argument for argument index in method wrapper_CUDA__index_select)"))
    return None


_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm"})


def matmul_device_refusal(op: OpCall) -> str | None:
    """CUDA's refusal of a matrix product whose operands sit on the GPU and the CPU (a weight given a host
    tensor, a layer left on the CPU without a bias); the meta kernels of mm, addmm, bmm and baddbmm check no
    devices, where CUDA's generated wrapper refuses two (check_and_update_common_device)."""
    if op.op.split(".")[:2] not in [["aten", name] for name in _MATMULS]:
        return None
    gpu = next((t.device for t in op.operands if t.device != "cpu"), None)
    if gpu is None or not any(t.device == "cpu" and not t.is_scalar for t in op.operands):
        return None
    where = f"cuda:{gpu.split(':')[1]}" if gpu.startswith("meta:") else gpu
    return f"Expected all tensors to be on the same device, but found at least two devices, {where} and cpu!"


def _wrapper(device: str, clause: str) -> str:
    """CUDA's generated wrapper names itself in the message; a simulated Mac's error names no CUDA wrapper."""
    return "" if device.startswith("mps") else clause

def _signature(func: Any, args: tuple, kwargs: dict) -> tuple:
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return ("T", x.dtype, x.dim(), x.dim() == 0)
        if isinstance(x, (list, tuple)):
            return tuple(one(v) for v in x)
        if isinstance(x, (bool, str, torch.dtype, type(None), torch.layout, torch.memory_format)):
            return x
        if isinstance(x, float) and not math.isfinite(x):
            return ("float", "nonfinite")
        if isinstance(x, (int, float)):
            # Sizes and dims select no kernel dtype; a number's range decides whether it
            # fits the dtype it is written into (DD301), so beyond-fp16 numbers sign apart.
            return (type(x).__name__, _range_class(x))
        return type(x).__name__

    return (func, one(args), tuple(sorted((k, one(v)) for k, v in kwargs.items())))


def _range_class(x: float) -> tuple[str, ...]:
    """The dtypes `x` fits without overflow: whether a kernel refuses a number written into a
    tensor depends on it (int8.fill_(100) runs, int8.fill_(200) does not), so it signs apart."""
    return tuple(dtype for dtype, (low, high) in _RANGES.items() if low <= x <= high)


_RANGES = {
    "uint8": (0, 255), "int8": (-128, 127), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), **{dtype: (-top, top) for dtype, top in DTYPE_MAX.items()},
}


def _flat(*objs: Any) -> list[Any]:
    out: list[Any] = []
    for o in objs:
        if isinstance(o, (list, tuple)):
            out.extend(_flat(*o))
        elif isinstance(o, dict):
            out.extend(_flat(*o.values()))
        else:
            out.append(o)
    return out


def _shrinker(tensors: list[torch.Tensor]) -> dict[int, int]:
    """Each distinct size over 8 → a distinct small size, so equal sizes stay equal."""
    sizes = sorted({int(s) for t in tensors for s in t.shape if int(s) > 8})
    return {s: 9 + i for i, s in enumerate(sizes)}


# LAPACK's pivots are 1-based: a pivot of 0 sends ldl_solve out of bounds (a double free on an
# H100 machine's CPU, torch 2.11); 1 is a valid pivot in any matrix.
_ONE_BASED = ("ldl_solve", "lu_solve", "lu_unpack", "ldl_factor", "lu_factor")


def _int_fill(func: Any) -> int:
    return 1 if any(name in str(func) for name in _ONE_BASED) else 0


def _materialise(obj: Any, shrink: dict[int, int] | None, int_fill: int = 0) -> Any:
    if isinstance(obj, torch.Tensor):
        shape = tuple(shrink.get(int(s), int(s)) for s in obj.shape) if shrink else tuple(int(s) for s in obj.shape)
        if obj.is_floating_point() or obj.is_complex():
            t = torch.full(shape, _FLOATING_FILL, dtype=obj.dtype)
        else:
            t = torch.full(shape, int_fill, dtype=obj.dtype) if obj.dtype != torch.bool else torch.zeros(shape, dtype=obj.dtype)
        return t
    if isinstance(obj, int) and not isinstance(obj, bool) and shrink:
        return shrink.get(obj, obj)
    if isinstance(obj, tuple):
        return tuple(_materialise(x, shrink, int_fill) for x in obj)
    if isinstance(obj, list):
        return [_materialise(x, shrink, int_fill) for x in obj]
    if isinstance(obj, dict):
        return {k: _materialise(v, shrink, int_fill) for k, v in obj.items()}
    if isinstance(obj, torch.device):
        return torch.device("cpu")
    return obj
