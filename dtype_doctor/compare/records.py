"""What `compare` measures, as small frozen records; no torch import.

A Variant says how a row runs (autocast or converted weights); a Row is what was measured
for it; a Comparison is the whole table with its recommendation and `to_dict()`, the
JSON (schema_version 1, the scan report's tool/target/environment blocks plus `compare`).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from dtype_doctor.machine.placement import HERE, Placement
from dtype_doctor.records.errors import UsageError
from dtype_doctor.records import COSINE_MIN, Subject, Target



@dataclass(frozen=True, slots=True)
class Variant:
    """One row: run the fp32 model under autocast, or convert its weights (`.half()`...)."""

    name: str
    label: str
    weights: str = "float32"  # dtype the row's weights are converted to
    autocast: str | None = None
    keep_fp32: bool = False  # fp16 with the minimal set of modules kept in float32
    quantize: str | None = None  # bitsandbytes: "int8", "nf4" or "fp4" Linear layers (compare/quantized.py); torchao: "mxfp8" (compare/mx.py)
    default: bool = True  # in the table when no --rows names the rows (mxfp8: asked for by name, torchao's import is slow)


VARIANTS = (
    Variant("fp32", "fp32"),
    Variant("autocast-fp16", "autocast fp16", autocast="float16"),
    Variant("autocast-bf16", "autocast bf16", autocast="bfloat16"),
    Variant("half", ".half()", weights="float16"),
    Variant("bfloat16", ".bfloat16()", weights="bfloat16"),
    Variant("fp16-keep-fp32", "fp16 + fp32 set", weights="float16", keep_fp32=True),
    Variant("bnb-int8", "bnb 8-bit", quantize="int8"),
    Variant("bnb-nf4", "bnb 4-bit nf4", quantize="nf4"),
    Variant("bnb-fp4", "bnb 4-bit fp4", quantize="fp4"),
    Variant("mxfp8", "torchao MXFP8", weights="bfloat16", quantize="mxfp8", default=False),
)
# The package each quantized row's layers come from
QUANTIZERS = {"mxfp8": ("torchao", "pip install torchao")}


def package_of(v: Variant) -> tuple[str, str]:
    """(the package a quantized row needs, how to install it)."""
    return QUANTIZERS.get(v.quantize or "", ("bitsandbytes", "pip install 'dtype-doctor[quant]'"))


def available(v: Variant) -> bool:
    """Quantized rows need their package (bitsandbytes, torchao); without it they are left out of the default table."""
    return v.quantize is None or importlib.util.find_spec(package_of(v)[0]) is not None


VARIANT_NAMES = tuple(v.name for v in VARIANTS if available(v))
DEFAULT_ROWS = tuple(v.name for v in VARIANTS if available(v) and v.default)
REFERENCE = "fp32"


def variant(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            if not available(v):
                package, install = package_of(v)
                raise UsageError(f"variant {name!r} needs {package}, which is not installed; {install}")
            return v
    raise UsageError(f"unknown variant {name!r}; choose from: {', '.join(VARIANT_NAMES)}")


@dataclass(frozen=True, slots=True)
class CompareRequest:
    """How to compare: which rows, where (the Placement decided at the entry: real tensors,
    HERE for wherever the model is), how many timed runs, forward or training step."""

    variants: tuple[str, ...] = DEFAULT_ROWS
    placement: Placement = HERE
    repeat: int = 3  # timed runs per row (the median is reported)
    warmup: int = 1  # untimed runs before the memory run and the timed ones
    train: bool = False  # time and peak memory of forward + backward instead of the forward
    subject: Subject | None = None

    @property
    def device(self) -> str | None:
        """The device the rows run on; None: where the model is."""
        return self.placement.device

    def rows(self) -> tuple[Variant, ...]:
        """The rows in table order; the fp32 reference is always measured."""
        for name in self.variants:
            variant(name)  # an unknown name is a usage error
        wanted = {REFERENCE, *self.variants}
        return tuple(v for v in VARIANTS if v.name in wanted)

    def validate(self) -> None:
        if self.repeat < 1:
            raise UsageError(f"--repeat must be at least 1, not {self.repeat}")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be at least 0, not {self.warmup}")
        self.rows()


@dataclass(frozen=True, slots=True)
class OutputError:
    """The row's primary output against the fp32 run's."""

    max_abs: float
    max_rel: float  # max |row - fp32| / max |fp32|
    cosine: float
    finite: bool

    def to_dict(self) -> dict[str, Any]:
        return {"max_abs_error": _num(self.max_abs), "max_rel_error": _num(self.max_rel), "cosine": _num(self.cosine), "output_finite": self.finite}


@dataclass(frozen=True, slots=True)
class OpError:
    """A matmul/conv op of the row matched to the fp32 run's by (module, op, occurrence).

    rel_error: max |row - fp32| / max |fp32| of its output, what the op hands on;
    own_rel_error: the same op recomputed in float32 on this row's own operands, so the
    part of the error the op itself adds (the cuBLAS Hgemm question), not what it inherited.
    """

    op: str
    module: str
    occurrence: int
    rel_error: float
    own_rel_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "module": self.module,
            "occurrence": self.occurrence,
            "rel_error": _num(self.rel_error),
            "own_rel_error": _num(self.own_rel_error),
        }


@dataclass(frozen=True, slots=True)
class TrainStep:
    """One real backward + torch.amp.GradScaler step on a copy of the row's model."""

    ok: bool
    detail: str
    error: str | None = None  # PyTorch's own exception, "ValueError: Attempting to unscale FP16 gradients."
    cuda: str | None = None  # what CUDA would do differently, when this ran elsewhere
    cuda_ok: bool | None = None

    @property
    def trains(self) -> bool:
        """Works here and would on CUDA."""
        return self.ok and self.cuda_ok is not False

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "error": self.error, "cuda": self.cuda, "cuda_ok": self.cuda_ok}


@dataclass(frozen=True, slots=True)
class Row:
    variant: Variant
    weight_bytes: int
    peak_bytes: int | None = None
    times: tuple[float, ...] = ()  # seconds, each timed run
    output: OutputError | None = None
    worst_op: OpError | None = None
    ops_compared: int = 0
    overflowing: tuple[str, ...] = ()  # non-finite here, finite in the fp32 run; first produced first
    nonfinite: tuple[str, ...] = ()  # every module whose output had inf/NaN in this row
    train_step: TrainStep | None = None
    fp32_modules: tuple[str, ...] | None = None  # the fp16 + fp32 set row: the modules kept
    note: str | None = None
    failure: str | None = None  # the row could not run: PyTorch's error
    verdict: str = ""

    @property
    def time_s(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def finite(self) -> bool:
        return self.failure is None and not self.overflowing and (self.output is None or self.output.finite)

    @property
    def accurate(self) -> bool:
        return self.output is not None and self.output.finite and self.output.cosine >= COSINE_MIN

    @property
    def trains(self) -> bool:
        return self.train_step is not None and self.train_step.trains

    def to_dict(self) -> dict[str, Any]:
        v = self.variant
        return {
            "name": v.name,
            "label": v.label,
            "weights_dtype": v.weights,
            "autocast": v.autocast,
            "weight_bytes": self.weight_bytes,
            "peak_bytes": self.peak_bytes,
            "time_s": self.time_s,
            "times_s": list(self.times),
            **(self.output.to_dict() if self.output else {"max_abs_error": None, "max_rel_error": None, "cosine": None, "output_finite": None}),
            "worst_op": self.worst_op.to_dict() if self.worst_op else None,
            "ops_compared": self.ops_compared,
            "overflowing_modules": list(self.overflowing),
            "nonfinite_modules": list(self.nonfinite),
            "train_step": self.train_step.to_dict() if self.train_step else None,
            "fp32_modules": list(self.fp32_modules) if self.fp32_modules is not None else None,
            "note": self.note,
            "failure": self.failure,
            "verdict": self.verdict,
        }


@dataclass(frozen=True, slots=True)
class Recommendation:
    question: str  # "autocast or .half()?"
    row: str | None  # the variant's name; None: nothing but fp32
    line: str
    inference_row: str | None = None  # the pick when training does not matter, when it differs

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "row": self.row, "line": self.line, "inference_row": self.inference_row}


@dataclass(frozen=True)
class Comparison:
    target: Target
    environment: Mapping[str, Any]
    output: str  # the primary output compared (logits, last_hidden_state, ...)
    peak_method: str  # "torch.cuda.max_memory_allocated" or "tracked tensor bytes"
    repeat: int
    rows: tuple[Row, ...]
    recommendation: Recommendation
    gpu_name: str | None = None
    measures: str = "forward"  # or "forward + backward" (--train)

    def row(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.variant.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        from dtype_doctor import __version__

        return {
            "schema_version": 1,
            "tool": {"name": "dtype-doctor", "version": __version__},
            "target": self.target.to_dict(),
            "environment": dict(self.environment),
            "compare": {
                "reference": REFERENCE,
                "output": self.output,
                "measures": self.measures,
                "peak_memory": self.peak_method,
                "repeat": self.repeat,
                "gpu_name": self.gpu_name,
                "cosine_min": COSINE_MIN,
                "rows": [r.to_dict() for r in self.rows],
                "recommendation": self.recommendation.to_dict(),
            },
        }


def _num(x: float | None) -> float | None:
    """JSON has no inf or NaN: a non-finite measurement is null (output_finite says why)."""
    return x if x is not None and math.isfinite(x) else None
