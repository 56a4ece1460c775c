"""Cases drawn from PyTorch's own op database, for the oracle tests and the full sweep.

A case is one call of an OpInfo op: a valid float32 sample with one tensor argument cast
to another dtype ("perturbed"), the sample as it is ("clean"), or one of the op's own
error inputs about dtypes ("error-input"). The real call on this CPU is the oracle; the
doctor's verdict comes from tracing the same call wrapped in a module.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterator

import torch

# Ops whose samples are slow, need complex or sparse support, hold non-tensor state, or
# whose result depends on more than dtypes (random sampling, allocation-only ops).
_SKIP_PREFIXES = ("sparse.", "fft.", "_refs", "signal.", "to_sparse", "nn.functional.dropout",
                  # op_db's CUDA-only jiterator test ops: no CPU kernel, and on an H100 (torch 2.11)
                  # their mixed-dtype samples are illegal memory accesses that end the process
                  "jiterator_")
_SKIP = {
    "bernoulli", "normal", "multinomial", "rand_like", "randn_like", "randint_like", "randint",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "uniform",
    "cauchy", "exponential", "geometric", "log_normal", "nn.functional.rrelu", "item",
    "tolist", "cuda", "cpu", "to", "nonzero_static", "torch._scaled_mm", "nn.functional.feature_alpha_dropout",
    "resize_", "resize_as_", "equal", "allclose", "isclose",
}
# An error input is about dtypes when PyTorch's expected message names one (type names are
# case-sensitive: "pad should be at most half of kernel size" names none).
_DTYPE_WORDS = re.compile(
    r"(?i:dtype|scalar type|not implemented for|to type|type int)|Half|\bFloat|Double|BFloat16|\bLong|\bInt\b|Bool"
)


@dataclass(frozen=True)
class Case:
    op: str  # the OpInfo name with its variant
    family: str  # for the sweep's figures
    kind: str  # perturbed | clean | error-input
    call: Callable[..., Any]
    args: tuple
    kwargs: dict
    what: str  # the perturbation, e.g. "args[0] float32→float16"
    aten: str = ""  # the aten op it calls (OpInfo.aten_name)
    info: Any = field(default=None, compare=False)  # its OpInfo (a module case: its op's, if op_db has one)

    def fresh(self) -> tuple[tuple, dict]:
        """Copies of the arguments (in-place ops must not see each other's writes)."""
        return _map(self.args, _clone), _map(self.kwargs, _clone)

    def __str__(self) -> str:
        return f"{self.op} [{self.kind}] {self.what}"


def _recent_gpu() -> None:
    """op_db reads its CUDA dtype lists' capability gates (SM53OrLater, SM80OrLater) from the GPU
    it runs on when first imported; a CPU build closes them all. Open them, as on the recent GPU a
    simulated CUDA trace targets by default, before anything imports op_db."""
    import sys

    import torch.testing._internal.common_cuda as common_cuda

    assert "torch.testing._internal.common_methods_invocations" not in sys.modules, "op_db was imported first"
    for name in dir(common_cuda):
        if name.startswith("SM") and name.endswith("OrLater"):
            setattr(common_cuda, name, True)


@lru_cache(maxsize=1)
def ops() -> tuple[Any, ...]:
    _recent_gpu()
    from torch.testing._internal.common_methods_invocations import op_db

    return tuple(
        o for o in op_db
        if o.name not in _SKIP and not o.name.startswith(_SKIP_PREFIXES)
        and torch.float32 in o.supported_dtypes("cpu")
    )


def family(name: str) -> str:
    for prefix in ("nn.functional.", "linalg.", "special."):
        if name.startswith(prefix):
            return prefix.rstrip(".")
    return "torch"


def _targets(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    if dtype.is_floating_point:
        return tuple(d for d in (torch.float16, torch.bfloat16, torch.float64, torch.int32) if d != dtype)
    if dtype == torch.bool:
        return (torch.float32, torch.int64)
    if dtype.is_complex:
        return ()
    return (torch.int32 if dtype == torch.int64 else torch.int64, torch.float32)


KINDS = ("perturbed", "clean", "error-input", "module", "module-clean", "module-error-input")


def cases(*, samples_per_op: int = 2, kinds: tuple[str, ...] = KINDS) -> Iterator[Case]:
    for o in ops():
        yield from op_cases(o, samples_per_op=samples_per_op, kinds=kinds)
    if any(k.startswith("module") for k in kinds):
        for m in modules():
            yield from module_cases(m, samples=samples_per_op, kinds=kinds)


@lru_cache(maxsize=1)
def modules() -> tuple[Any, ...]:
    ops()  # op_db first, with the capability gates of a recent GPU
    from torch.testing._internal.common_modules import module_db

    return tuple(m for m in module_db if not m.module_cls.__name__.startswith("Lazy") and torch.float32 in m.dtypes)


@lru_cache(maxsize=None)
def opinfo(aten: str) -> Any:
    """The OpInfo of an aten op name ("conv2d" → nn.functional.conv2d), or None."""
    for o in ops():
        if not o.variant_test_name and o.aten_name.removeprefix("nn.functional.") == aten:
            return o
    return None


# The aten op a module's forward runs, where its snake_case name is not it.
_MODULE_OPS = {"MultiLabelMarginLoss": "multilabel_margin_loss", "LocalResponseNorm": "avg_pool3d", "LPPool3d": "avg_pool3d",
               "LPPool2d": "avg_pool2d", "LPPool1d": "avg_pool1d"}


def _module_op(cls_name: str) -> str:
    return _MODULE_OPS.get(cls_name) or re.sub(r"(?<!^)(?=[A-Z])", "_", cls_name).lower()


def module_cases(m: Any, *, samples: int = 2, kinds: tuple[str, ...] = ("module",)) -> Iterator[Case]:
    """A float32 module from module_db as sampled ("module-clean"), with one forward tensor cast to
    another dtype ("module"), and its own forward error inputs ("module-error-input")."""
    name = f"nn.{m.module_cls.__name__}"
    aten = _module_op(m.module_cls.__name__)
    info = opinfo(aten)
    try:
        inputs = m.module_inputs_func(m, device="cpu", dtype=torch.float32, requires_grad=False, training=False)[:samples]
    except Exception:  # noqa: BLE001 - an inputs generator that fails on this build is skipped
        inputs = []
    for mi in inputs:
        module = _build(m, mi)
        if module is None:
            continue
        args, kwargs = tuple(mi.forward_input.args), dict(mi.forward_input.kwargs)
        if "module-clean" in kinds:
            yield Case(name, "nn.Module", "module-clean", module, args, kwargs, "as sampled", aten, info)
        if "module" in kinds:
            for path, t in _tensor_paths(args, kwargs):
                for d in _targets(t.dtype):
                    a, k = _replace(args, kwargs, path, t.to(d))
                    yield Case(name, "nn.Module", "module", module, a, k, f"{path} {_n(t.dtype)}→{_n(d)}", aten, info)
    if "module-error-input" in kinds and m.module_error_inputs_func is not None:
        from torch.testing._internal.common_modules import ModuleErrorEnum

        try:
            errors = m.module_error_inputs_func(m, device="cpu", dtype=torch.float32, requires_grad=False, training=False)
        except Exception:  # noqa: BLE001
            errors = []
        for e in errors:
            if e.error_on != ModuleErrorEnum.FORWARD_ERROR:
                continue
            mi = e.module_error_input
            module = _build(m, mi)
            if module is not None:
                args, kwargs = tuple(mi.forward_input.args), dict(mi.forward_input.kwargs)
                yield Case(name, "nn.Module", "module-error-input", module, args, kwargs, str(e.error_regex)[:60], aten, info)


def _build(m: Any, mi: Any) -> torch.nn.Module | None:
    try:
        return m.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs).to(torch.float32).eval()
    except Exception:  # noqa: BLE001 - a constructor this build rejects is skipped
        return None


def op_cases(o: Any, *, samples_per_op: int = 2, kinds: tuple[str, ...] = ("perturbed", "clean", "error-input")) -> Iterator[Case]:
    name = o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")
    fam = family(o.name)
    try:
        samples = []
        for s in o.sample_inputs("cpu", torch.float32):
            samples.append(s)
            if len(samples) >= samples_per_op:
                break
    except Exception:  # noqa: BLE001 - a sample generator that fails on this build is skipped
        return
    for s in samples:
        args = (s.input, *s.args)
        if "clean" in kinds:
            yield Case(name, fam, "clean", o.op, args, dict(s.kwargs), "as sampled", o.aten_name, o)
        if "perturbed" in kinds:
            for path, t in _tensor_paths(args, s.kwargs):
                for d in _targets(t.dtype):
                    a, k = _replace(args, s.kwargs, path, t.to(d))
                    yield Case(name, fam, "perturbed", o.op, a, k, f"{path} {_n(t.dtype)}→{_n(d)}", o.aten_name, o)
    if "error-input" in kinds and o.error_inputs_func is not None:
        try:
            errors = list(o.error_inputs("cpu"))
        except Exception:  # noqa: BLE001
            return
        for e in errors:
            if e.error_type not in (RuntimeError, TypeError) or not _DTYPE_WORDS.search(str(e.error_regex)):
                continue
            s = e.sample_input
            yield Case(name, fam, "error-input", o.op, (s.input, *s.args), dict(s.kwargs), str(e.error_regex)[:60], o.aten_name, o)


def sampled(n_ops: int, per_op: int = 2, seed: int = 0) -> list[Case]:
    """A reproducible sample (the CI subset): `per_op` cases from each of `n_ops` random ops."""
    rng = random.Random(seed)
    chosen = rng.sample(list(ops()), n_ops)
    out: list[Case] = []
    for o in chosen:
        found = list(op_cases(o, samples_per_op=1))
        out.extend(rng.sample(found, min(per_op, len(found))))
    return out


def sampled_modules(n_modules: int, per_module: int = 2, seed: int = 0) -> list[Case]:
    """A reproducible sample of module_db cases: perturbed, clean and (every) forward error input."""
    rng = random.Random(seed)
    out: list[Case] = []
    for m in rng.sample(list(modules()), min(n_modules, len(modules()))):
        found = list(module_cases(m, samples=1, kinds=("module", "module-clean", "module-error-input")))
        perturbed = [c for c in found if c.kind == "module"]
        out.extend(rng.sample(perturbed, min(per_module, len(perturbed))))
        out.extend(c for c in found if c.kind != "module")
    return out


# ------------------------------------------------------------------ running a case


def real_error(case: Case, device: str = "cpu") -> BaseException | None:
    """The real call's error on `device` (None: it ran). On a GPU the case's tensors and module
    are copied there first, as `diagnose(device=...)` moves them, and the call is synchronised
    so an asynchronous kernel error belongs to this case."""
    args, kwargs = case.fresh()
    call = case.call
    try:
        if device != "cpu":
            args, kwargs = _map((args, kwargs), lambda t: t.to(device))
            if isinstance(call, torch.nn.Module):
                import copy

                call = copy.deepcopy(call).to(device)
        call(*args, **kwargs)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - the outcome is what we record
        return exc
    return None


class OpModule(torch.nn.Module):
    """Calls one op with its tensors passed in as named inputs, so the doctor traces them."""

    def __init__(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        super().__init__()
        self.call = call
        self.slots: list[str] = []
        self.template = _map((args, kwargs), self._slot)

    def _slot(self, t: torch.Tensor) -> Any:
        self.slots.append(f"t{len(self.slots)}")
        return _Slot(self.slots[-1])

    def forward(self, **tensors: torch.Tensor) -> Any:
        args, kwargs = _map(self.template, lambda s: tensors[s.name], kind=_Slot)
        return self.call(*args, **kwargs)

    def inputs(self, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        found: list[torch.Tensor] = []
        _map((args, kwargs), lambda t: found.append(t) or t)
        return dict(zip(self.slots, found))


def doctor_report(case: Case, *, simulate: bool = False, device: str | None = None, **options: Any) -> Any:
    import dtype_doctor

    args, kwargs = case.fresh()
    module = OpModule(case.call, args, kwargs)
    return dtype_doctor.diagnose(module, module.inputs(args, kwargs), simulate=simulate, device=device, **options)


def expected_on_cuda(case: Case, real: BaseException | None) -> str | None:
    """The real CPU outcome turned into the CUDA one, read from PyTorch's own declarations and
    sources, not from dtype-doctor's table code (trace/cuda_table.py), which this checks:

    * the case's OpInfo `dtypes` / `dtypesIfCUDA` (op_db, capability gates open: a recent GPU):
      a first tensor's dtype listed for CPU but not for CUDA is refused on CUDA; a CPU refusal
      "not implemented for 'X'" of a dtype CUDA lists is accepted there;
    * conv with a bias dtype other than the input's: cuDNN checks it, the CPU slow path does not
      (aten/src/ATen/native/Convolution.cpp, check_input_same_type_as_parameters);
    * integer max_pool1d: CUDA always takes max_pool2d_with_indices, floating only
      (aten/src/ATen/native/MaxPooling.cpp);
    * layer_norm / group_norm: the CUDA kernels read weight and bias as the input's scalar type
      (layer_norm_kernel.cu, group_norm_kernel.cu), where the CPU ones take mixed types;
    * integer max_unpool: the CUDA kernels dispatch every integer type (MaxUnpooling.cu,
      AT_DISPATCH_ALL_TYPES_AND(Half)) where op_db lists, and the CPU runs, floating types only;
    * an op the CPU runs on mixed dtypes computes in the promoted dtype: op_db's CUDA list is
      asked for that one too (an int32 addend of addmv runs on CUDA in float32);
    * native_dropout_backward takes a bool mask only on CUDA.
    The last four rows were found by the real-GPU sweep (benchmarks/oracle_cuda.py).
    """
    tensors = list(_tensor_paths(case.args, case.kwargs))
    first = tensors[0][1] if tensors else None
    cpu_error = None if real is None else ((str(real).splitlines() or [type(real).__name__])[0] or type(real).__name__)
    cpu, cuda = (set(case.info.supported_dtypes("cpu")), set(case.info.supported_dtypes("cuda"))) if case.info is not None else (set(), set())
    op = case.aten.removeprefix("nn.functional.")
    if cpu_error is not None:
        named = re.search(r"not implemented for '(\w+)'", cpu_error)
        if named and _SCALAR_NAMES.get(named.group(1)) in cuda and _SCALAR_NAMES.get(named.group(1)) not in cpu:
            return None
        if op.startswith("max_unpool") and first is not None and not first.is_floating_point():
            return None
        return cpu_error
    if first is not None and first.dtype in cpu and first.dtype not in cuda and _promoted(tensors) not in cuda:
        return f"{case.aten}: op_db lists {_n(first.dtype)} for CPU, not CUDA"
    if op == "native_dropout_backward" and len(tensors) > 1 and tensors[1][1].dtype != torch.bool:
        return "CUDA native_dropout_backward: Mask should be Bool"
    if op in ("layer_norm", "native_layer_norm", "group_norm", "native_group_norm") and first is not None:
        params = [t for t in _module_params(case) or [t for _, t in tensors[1:]] if t.is_floating_point()]
        if any(t.dtype != first.dtype for t in params):
            return f"CUDA {op}: weight and bias must have the input's dtype"
    if op.startswith("conv") and first is not None and not case.kind.startswith("module"):
        bias = case.kwargs.get("bias", case.args[2] if len(case.args) > 2 else None)
        if isinstance(bias, torch.Tensor) and bias.dtype != first.dtype:
            return "cuDNN: Input type and bias type should be the same"
    if op == "max_pool1d" and first is not None and not first.is_floating_point():
        return "CUDA max_pool1d takes max_pool2d_with_indices, which has floating kernels only"
    return None


def _promoted(tensors: list[tuple[str, torch.Tensor]]) -> torch.dtype:
    """The dtype torch promotes the case's tensors to (what a kernel that ran mixed dtypes computed in)."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    return elementwise_dtypes(*(t for _, t in tensors), type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def _module_params(case: Case) -> list[torch.Tensor]:
    """A module case's parameters (the norm's weight and bias); none for an op case."""
    return list(case.call.parameters()) if isinstance(case.call, torch.nn.Module) else []


_SCALAR_NAMES = {
    "Half": torch.float16, "BFloat16": torch.bfloat16, "Float": torch.float32, "Double": torch.float64,
    "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool,
}


def judged(finding: Any) -> bool:
    """Whether the oracle can judge a finding. Value rules (DD301-DD303) judge numbers, which
    PyTorch does not raise on (op_db's igammac of random inputs is NaN; its matrix_exp samples
    exceed float16), except a constant PyTorch refused to write (DD301 with PyTorch's message)."""
    return not finding.code.startswith("DD3") or bool(finding.pytorch_error)


def errors_in(report: Any) -> list[Any]:
    return [f for f in report.findings if f.severity == "error" and judged(f)]


def warnings_in(report: Any) -> list[Any]:
    return [f for f in report.findings if f.severity == "warning" and judged(f)]


CLEAN = ("clean", "module-clean")


def cannot_follow(finding: Any) -> bool:
    """DD001 for a step fake tensors cannot take (data-dependent output shape, no meta kernel)."""
    return finding.code == "DD001" and "could not be simulated" in finding.message


def about_dtypes(exc: BaseException) -> bool:
    return bool(_DTYPE_WORDS.search(str(exc)))


# Where a simulated verdict differs from the real one for a reason outside dtypes and the
# CPU↔CUDA table: the sweep (benchmarks/oracle_sweep.py) and the README list them.
SIMULATION_LIMITS = {
    "tensor_split": "its index tensor must stay on the CPU; simulation moves every input to the target",
    "_segment_reduce": "the kernel reads its lengths' values, which fake tensors do not have",
    "nn.functional.linear_cross_entropy": "a chunked composite whose CPU path casts internally; the probe calls its parts",
    "inner": "integer inner decomposes into ops whose CUDA lists the table does not hold for inner itself",
    "linalg.matrix_power": "its integer decomposition meets a float identity in the fake path",
    # Found on an H100: called directly, CUDA's native batch norm kernel takes running stats of
    # another dtype; F.batch_norm and nn.BatchNorm* take cuDNN there, which refuses them, and the
    # simulation judges every batch norm as cuDNN does (trace/cuda_table.py).
    "native_batch_norm": "CUDA's native kernel (called directly) takes running stats cuDNN refuses; simulated as cuDNN",
    "_native_batch_norm_legit": "CUDA's native kernel (called directly) takes running stats cuDNN refuses; simulated as cuDNN",
}


# Real errors about values, not dtypes: fake tensors hold none, so no simulation sees them.
_VALUE_ERRORS = re.compile(r"index out of range|out of bounds|index \d+ is out of", re.I)


def simulation_limit(case: Case, real: BaseException | None = None) -> str | None:
    """Why the simulation cannot judge `case` (SIMULATION_LIMITS, or a real error about values), or None."""
    for name in (case.op, case.op.split(".")[0], case.op.rsplit(".", 1)[0]):
        if name in SIMULATION_LIMITS:
            return SIMULATION_LIMITS[name]
    if real is not None and _VALUE_ERRORS.search(str(real)):
        return "the real error is about values (an index out of range), which fake tensors do not hold"
    return None


# ------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class _Slot:
    name: str


def _n(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _clone(t: torch.Tensor) -> torch.Tensor:
    return t.clone()


def _map(obj: Any, f: Callable[[Any], Any], kind: type = torch.Tensor) -> Any:
    if isinstance(obj, kind):
        return f(obj)
    if isinstance(obj, tuple):
        return tuple(_map(x, f, kind) for x in obj)
    if isinstance(obj, list):
        return [_map(x, f, kind) for x in obj]
    if isinstance(obj, dict):
        return {k: _map(v, f, kind) for k, v in obj.items()}
    return obj


def _tensor_paths(args: tuple, kwargs: dict) -> Iterator[tuple[str, torch.Tensor]]:
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.numel() > 0:
            yield f"args[{i}]", a
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.numel() > 0:
            yield f"kwargs[{k}]", v


def _replace(args: tuple, kwargs: dict, path: str, new: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = list(args), dict(kwargs)
    key = path[path.index("[") + 1 : -1]
    if path.startswith("args"):
        args[int(key)] = new
    else:
        kwargs[key] = new
    return tuple(args), kwargs
