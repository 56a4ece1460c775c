"""Tensors and the ops that meet them: dtype families and limits, what is known of one tensor
(TensorMeta) and of its values (ValueStats), the op and module calls a trace records, the model's
state tensors."""

from __future__ import annotations

import math as _math
from dataclasses import dataclass
from typing import Any, Iterable


ROLES = ("input", "weight", "bias", "index", "target", "mask", "buffer", "output", "other")


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What the doctor knows of one tensor at one place: never its values."""

    dtype: str
    device: str
    shape: tuple[int, ...]
    role: str = "input"
    name: str | None = None
    # Where the tensor's dtype was decided: "input:NAME" (a model input),
    # "param:NAME" / "buffer:NAME" (model state), "created:OP@MODULE" (made inside
    # model code), or None when unknown.
    origin: str | None = None

    @property
    def is_floating(self) -> bool:
        return self.dtype in FLOATING

    @property
    def is_scalar(self) -> bool:
        return len(self.shape) == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "name": self.name,
            "dtype": self.dtype,
            "device": self.device,
            "shape": list(self.shape),
        }


# The batch keys a model takes its labels under (the Trainer's and the examples' names).
LABEL_KEYS = ("labels", "label", "label_ids")

FLOATING = frozenset({"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"})
HALF = frozenset({"float16", "bfloat16"})
FLOAT8 = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
INTEGER = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


# float16's limits: the largest finite value and the smallest normal one. bfloat16 shares
# float32's exponent range, so "fp16" is the half dtype whose range a value can leave.
FP16_MAX = 65504.0
FP16_TINY = 2.0**-14  # 6.1e-05, torch.finfo(torch.float16).tiny
GRAD_SCALE = 2.0**16  # torch.amp.GradScaler's initial scale
# "Close to fp32": the primary output's cosine against the float32 reference at least this
# (compare's "accurate" verdict and keep-fp32's search share it).
COSINE_MIN = 0.999
# The largest finite value of each dtype a number can be written into.
DTYPE_MAX = {"float16": FP16_MAX, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}


@dataclass(frozen=True, slots=True)
class ValueStats:
    """What one tensor's values looked like: measured where the tensor lived, read back once.

    `absmax` and `nonfinite_any` are exact over the whole tensor. The shares and
    `min_nonzero` come from `sampled` evenly spaced elements (every element of a small
    tensor), so a value seen nowhere in the sample is not claimed.
    """

    absmax: float  # largest |x|; inf or nan when the tensor holds them
    nonfinite_any: bool
    min_nonzero: float | None  # smallest non-zero |x| among the sampled values
    nonfinite: float  # share of sampled values that are inf or nan
    below_fp16_normal: float  # share of sampled non-zero values below FP16_TINY
    below_fp16_normal_scaled: float  # the same after multiplying by GRAD_SCALE
    sampled: int
    numel: int

    @property
    def finite(self) -> bool:
        return not self.nonfinite_any


def merge_stats(stats: list[ValueStats]) -> ValueStats | None:
    """Several tensors' statistics as one: the extremes, and shares weighted by samples."""
    if not stats:
        return None
    if len(stats) == 1:
        return stats[0]
    sampled = sum(s.sampled for s in stats) or 1
    mins = [s.min_nonzero for s in stats if s.min_nonzero is not None]
    absmax = _math.nan if any(_math.isnan(s.absmax) for s in stats) else max(s.absmax for s in stats)
    return ValueStats(
        absmax=absmax,
        nonfinite_any=any(s.nonfinite_any for s in stats),
        min_nonzero=min(mins) if mins else None,
        nonfinite=sum(s.nonfinite * s.sampled for s in stats) / sampled,
        below_fp16_normal=sum(s.below_fp16_normal * s.sampled for s in stats) / sampled,
        below_fp16_normal_scaled=sum(s.below_fp16_normal_scaled * s.sampled for s in stats) / sampled,
        sampled=sum(s.sampled for s in stats),
        numel=sum(s.numel for s in stats),
    )


@dataclass(frozen=True, slots=True)
class OpCall:
    """One op as the recorder saw it, with its operands after autocast's casts."""

    index: int
    op: str  # "aten.addmm.default", or "torch.nn.functional.scaled_dot_product_attention"
    module: str  # innermost module's dotted name, "" for the model itself
    module_type: str
    operands: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...] = ()
    phase: str = "forward"  # forward | backward
    autocast: str | None = None  # autocast dtype in force for the op's device, if any
    error: str | None = None  # what PyTorch raised for this op (first line), if it raised
    recovered: bool = False  # the recorder repaired the operands to keep tracing
    level: str = "aten"  # aten (dispatcher) | function (torch function / F.*)
    # Extra facts an op family needs (e.g. "ignore_index"); plain values only.
    attrs: tuple[tuple[str, Any], ...] = ()
    # Values of the first floating output, and the largest of the floating operands' (real traces).
    stats: ValueStats | None = None
    operand_stats: ValueStats | None = None

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def by_role(self, *roles: str) -> tuple[TensorMeta, ...]:
        return tuple(t for t in self.operands if t.role in roles)

    def measured(self, stats: ValueStats | None, operand_stats: ValueStats | None, attrs: tuple[tuple[str, Any], ...]) -> "OpCall":
        """This op with its value statistics, once the trace is done (built directly: for every op of
        every trace, dataclasses.replace costs several times as much)."""
        return OpCall(self.index, self.op, self.module, self.module_type, self.operands, self.outputs, self.phase,
                      self.autocast, self.error, self.recovered, self.level, attrs, stats, operand_stats)


@dataclass(frozen=True, slots=True)
class ModuleCall:
    name: str
    module_type: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    phase: str = "forward"
    # Values of the floating outputs and of the floating inputs, merged (real traces).
    stats: ValueStats | None = None
    input_stats: ValueStats | None = None

    def measured(self, stats: ValueStats | None, input_stats: ValueStats | None) -> "ModuleCall":
        """This call with its value statistics (as OpCall.measured)."""
        return ModuleCall(self.name, self.module_type, self.inputs, self.outputs, self.phase, stats, input_stats)


@dataclass(frozen=True, slots=True)
class GradStats:
    """A trainable parameter's gradient after the traced backward."""

    name: str
    dtype: str
    stats: ValueStats


@dataclass(frozen=True, slots=True)
class OptimizerGroup:
    """One param group of an optimizer the script made: its class, the hyperparameters that decide
    whether an update survives half precision, and the dtypes of the parameters it updates."""

    optimizer: str  # "AdamW"
    lr: float | None
    eps: float | None  # None: the optimizer has none (SGD)
    dtypes: tuple[str, ...]
    params: int


@dataclass(frozen=True, slots=True)
class StateTensor:
    """A parameter or buffer of the model, as it was when the trace started."""

    name: str
    kind: str  # parameter | buffer
    dtype: str
    device: str
    shape: tuple[int, ...]
    requires_grad: bool = False
    persistent: bool = True


def in_modules(modules: tuple[str, ...], name: str) -> bool:
    """Whether dotted `name` lies in one of `modules`, matched the way transformers matches them."""
    parts = name.split(".")
    return any(m in parts or f".{m}." in f".{name}." or name.startswith(f"{m}.") for m in modules)


def dtype_name(dtype: Any) -> str:
    """'float16' for torch.float16 (or its name): the dtype name reports and rules use. The
    one definition: torch-free, so loading and the CLI use it too."""
    return str(dtype).removeprefix("torch.")


def main_dtype_of(sizes: Iterable[tuple[str, int]]) -> str | None:
    """The floating dtype holding the most elements (ties: the first in name order)."""
    weight: dict[str, int] = {}
    for dtype, n in sizes:
        if dtype in FLOATING:
            weight[dtype] = weight.get(dtype, 0) + n
    return max(sorted(weight), key=weight.__getitem__) if weight else None


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
