"""The records every stage passes on: small frozen dataclasses, no torch import.

load → trace → rules → fix → report all speak in these types, so a rule can be tested
on a hand-built Trace and a formatter on a hand-built Report.
"""

from __future__ import annotations

import math as _math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from dtype_doctor.fix.outcome import FixOutcome

# Where a dtype or device can come from, in pipeline order. "formatter" (the datasets
# torch/numpy formatter) is an addition to SPEC.md's list: it silently casts fp16 → fp32
# and int32 → int64, and users need to see it.
STAGES = (
    "dataset",
    "preprocess",
    "processor",
    "formatter",
    "collator",
    "transfer",
    "model-loading",
    "model-code",
    "loss",
    "optimizer",
    "launch",  # the launcher's configuration (accelerate / DeepSpeed files): before the step, listed last as an addition
)
LINEAGE_STAGES = (
    "dataset",
    "preprocess",
    "processor",
    "formatter",
    "collator",
    "transfer",
    "model-boundary",
)
SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}

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


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One kind of adapter weight (peft's lora_A, lora_B …) on a quantized base: how many, in what dtype."""

    kind: str  # "lora_A", "lora_B", "lora_embedding_A" …
    dtype: str
    count: int
    trainable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "count": self.count, "trainable": self.trainable}


@dataclass(frozen=True, slots=True)
class QuantizationInfo:
    """What a quantized model is (SPEC addition: `target.quantization`): the method, the dtype its
    quantized weights are stored in, the dtype its layers compute in, and the adapters on it."""

    method: str  # "bitsandbytes-4bit" | "bitsandbytes-8bit"
    storage_dtype: str  # dtype of the packed weights (uint8 by default, bnb_4bit_quant_storage)
    compute_dtype: str | None  # bnb_4bit_compute_dtype (float16 for 8-bit: int8 matmuls take half inputs)
    quant_type: str | None  # nf4 | fp4 | int8
    layers: int  # quantized Linear layers
    adapters: tuple[AdapterInfo, ...] = ()
    double_quant: bool = False
    fp32_cpu_offload: bool = False  # llm_int8_enable_fp32_cpu_offload
    # module → device for a model dispatched over several devices (accelerate's hf_device_map)
    device_map: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "storage_dtype": self.storage_dtype,
            "compute_dtype": self.compute_dtype,
            "quant_type": self.quant_type,
            "quantized_layers": self.layers,
            "double_quant": self.double_quant,
            "fp32_cpu_offload": self.fp32_cpu_offload,
            "adapters": [a.to_dict() for a in self.adapters],
        }

    def describe(self) -> str:
        """One header line: "bitsandbytes 4-bit nf4: 14 layers, uint8 storage, compute float16; adapters lora_A float32 ×14"."""
        bits = self.method.removeprefix("bitsandbytes-").replace("bit", "-bit")
        kind = f"{bits} {self.quant_type}" if self.quant_type and self.quant_type != "int8" else bits
        layers = f"{self.layers} quantized layers" if self.layers else "not loaded"
        line = (f"bitsandbytes {kind}: {layers}, {self.storage_dtype} storage, "
                f"compute {self.compute_dtype or 'the input dtype'}")
        if self.adapters:
            line += "; adapters " + ", ".join(f"{a.kind} {a.dtype} ×{a.count}" for a in self.adapters)
        return line


@dataclass(frozen=True, slots=True)
class RotaryFacts:
    """A rotary embedding's frequencies (recomputed in float32 from the model's config) and what a
    half-precision copy of them does at the model's longest position (DD109)."""

    module: str  # the rotary embedding module, "model.rotary_emb"
    max_position: int  # config.max_position_embeddings
    head_dim: int  # 2 × the number of frequencies
    rope_type: str
    # per half dtype: (largest phase error in radians at max_position - 1, that error in positions)
    error: tuple[tuple[str, float, float], ...] = ()

    def error_in(self, dtype: str) -> tuple[float, float] | None:
        return next(((rad, pos) for d, rad, pos in self.error if d == dtype), None)


@dataclass(frozen=True, slots=True)
class LoadFacts:
    """How `from_pretrained` loaded the model (SPEC `target.loaded_dtype`), as the doctor saw the load.

    `origin`: "argument" (dtype= named one), "auto" (dtype="auto" asked for), "config" (nothing asked:
    transformers 5 reads config.json's dtype), "checkpoint" (nothing in the config: the weights'
    dtype), "default" (torch's default dtype). `v4_dtype` is what transformers 4 gave the same call.
    """

    dtype: str
    origin: str
    asked: str | None = None  # the call's dtype= ("auto", "bfloat16"), None when it named none
    config_dtype: str | None = None
    checkpoint_dtype: str | None = None
    library: str | None = None  # "transformers 5.24.0"
    v4_dtype: str | None = None
    attn_implementation: str | None = None  # asked for, in config.json or the call
    attn_origin: str | None = None  # "config" | "call"
    attn_traced_as: str | None = None  # what the trace ran in its place (flash-attn cannot run on this machine)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "origin": self.origin, "asked": self.asked, "config_dtype": self.config_dtype,
                "checkpoint_dtype": self.checkpoint_dtype, "library": self.library, "v4_dtype": self.v4_dtype}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    class_name: str
    state: tuple[StateTensor, ...]
    keep_in_fp32_modules: tuple[str, ...] = ()
    module_types: tuple[tuple[str, str], ...] = ()  # (dotted name, class name)
    # The classification head's configuration as the model was handed over: transformers'
    # *ForSequenceClassification / *ForImageClassification models pick problem_type from the
    # labels' dtype the first time, when it is None (DD111). None where the model has no config.
    num_labels: int | None = None
    problem_type: str | None = None
    quantization: QuantizationInfo | None = None  # a bitsandbytes model (DD5xx read it)
    # The attention implementation the model's config holds (transformers' config._attn_implementation).
    attn_implementation: str | None = None
    rotary: tuple["RotaryFacts", ...] = ()  # the rotary embeddings' frequencies at the model's longest position (DD109)
    # A pipeline traced as one (diffusers): (component name, class) of each component, the model's children.
    components: tuple[tuple[str, str], ...] = ()

    def component_of(self, name: str) -> str | None:
        """The pipeline component a dotted module or parameter name lies in, None outside any."""
        head = name.split(".", 1)[0]
        return head if any(c == head for c, _ in self.components) else None

    @property
    def parameters(self) -> tuple[StateTensor, ...]:
        return tuple(s for s in self.state if s.kind == "parameter")

    @property
    def buffers(self) -> tuple[StateTensor, ...]:
        return tuple(s for s in self.state if s.kind == "buffer")

    @property
    def main_dtype(self) -> str | None:
        """The dtype most parameter elements are in: what "the model's dtype" means."""
        return main_dtype_of((p.dtype, numel(p.shape)) for p in self.parameters)

    def module_type(self, name: str) -> str:
        for n, t in self.module_types:
            if n == name:
                return t
        return ""


@dataclass(frozen=True, slots=True)
class SourceLoc:
    file: str
    line: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}


@dataclass(frozen=True, slots=True)
class LineageStep:
    """One input tensor at one pipeline stage."""

    stage: str  # one of LINEAGE_STAGES
    dtype: str | None
    device: str | None = None
    shape: tuple[int, ...] | None = None
    detail: str = ""  # e.g. "datasets TorchFormatter casts floating columns to float32"
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "dtype": self.dtype,
            "device": self.device,
            "shape": list(self.shape) if self.shape is not None else None,
            "detail": self.detail,
            "source": self.source.to_dict() if self.source else None,
        }


Lineage = Mapping[str, tuple[LineageStep, ...]]


@dataclass(frozen=True, slots=True)
class TraceFailure:
    """The forward/backward stopped: an error the recorder could not step over."""

    kind: str  # dtype | device | other
    message: str
    module: str
    module_type: str
    op: str | None
    phase: str = "forward"


# The phases of a training step, in order: what `coverage` says a trace reached.
PHASES = ("forward", "loss", "backward", "scaler", "optimizer")


@dataclass(frozen=True, slots=True)
class StandIn:
    """A value a simulated step asked of a tensor that holds none, and what the simulation took instead.

    `what` is the read (`Tensor.item`, `Tensor.__bool__`, `torch.nonzero` for a size), `value`
    the stand-in as users read it ("1.0", "True", "0.0 (no inf found)", "12 rows"), `why` the
    reason that value is the plausible one, `source` the user's line that asked (or the library's).
    """

    what: str
    value: str
    why: str
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "value": self.value, "why": self.why,
                "source": self.source.to_dict() if self.source else None}


@dataclass(frozen=True, slots=True)
class HeldWrite:
    """A file a simulated run wrote into its scratch directory instead of the user's file system:
    the path as the script named it (relative to the working directory when below it), its size
    at the end of the run, and the user's line that wrote it last."""

    path: str
    bytes: int
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "source": self.source.to_dict() if self.source else None}


@dataclass(frozen=True, slots=True)
class CompiledRegion:
    """A region the script handed to torch.compile, which the trace ran eagerly, op by op.

    torch.compile does not compile under a dispatch mode (dynamo skips such frames: "non-infra
    torch dispatch mode present"), so the trace sees every op as eager PyTorch runs them; what the
    compiled code computes can differ (DD304). `module` is the region's dotted name in the traced
    model ("" the model itself), None for a function or a module outside the model."""

    target: str  # what was compiled: the module's class, or the function's qualified name
    kind: str  # module | function
    module: str | None
    backend: str  # "inductor" (torch.compile's default), "eager", "aot_eager", or a callable's name
    mode: str | None = None
    emulate_precision_casts: bool = False  # inductor rounds between fused half-precision ops as eager does
    called: bool = False  # the region ran in the traced step
    source: SourceLoc | None = None  # the script's torch.compile line

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "kind": self.kind, "module": self.module, "backend": self.backend, "mode": self.mode,
                "emulate_precision_casts": self.emulate_precision_casts, "called": self.called, "traced": "eagerly",
                "source": self.source.to_dict() if self.source else None}


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a step the trace saw: the phases reached of those the step has, the model's
    modules called, ops recorded, stand-ins taken, and where and why it stopped early."""

    phases: tuple[str, ...]  # reached, in PHASES order
    expected: tuple[str, ...]  # the step's phases (scaler only with a GradScaler on, optimizer only with one)
    modules_called: int
    modules_total: int
    ops: int
    stand_ins: int = 0
    steps: int = 1  # optimizer steps traced (forward calls where there is no optimizer)
    stopped: str | None = None  # where and why the trace ended before the step's end
    compiled: tuple[CompiledRegion, ...] = ()  # regions torch.compile would have compiled, traced eagerly
    # A step of several models: each model's calls after its first (a denoising loop's), run and repaired
    # but not kept, and the ops they (and what ran between them) recorded.
    skipped: tuple[tuple[str, int], ...] = ()
    dropped_ops: int = 0

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(p for p in self.expected if p not in self.phases)

    @property
    def complete(self) -> bool:
        return self.stopped is None and not self.missing

    def to_dict(self) -> dict[str, Any]:
        return {
            "phases": {p: (p in self.phases) for p in PHASES if p in self.expected or p in self.phases},
            "complete": self.complete,
            "modules_called": self.modules_called,
            "modules_total": self.modules_total,
            "ops": self.ops,
            "stand_ins": self.stand_ins,
            "steps": self.steps,
            "stopped": self.stopped,
            **({"compiled": [r.to_dict() for r in self.compiled]} if self.compiled else {}),
            **({"skipped": {"calls": dict(self.skipped), "ops": self.dropped_ops}} if self.skipped else {}),
        }


@dataclass(frozen=True, slots=True)
class Trace:
    ops: tuple[OpCall, ...]
    modules: tuple[ModuleCall, ...]
    model: ModelInfo
    inputs: tuple[TensorMeta, ...]  # the forward's keyword inputs at the model boundary
    lineage: Lineage = field(default_factory=dict)
    device: str = "cpu"
    simulated: bool = False
    autocast: str | None = None
    train: bool = False
    failure: TraceFailure | None = None
    sources: Mapping[str, SourceLoc] = field(default_factory=dict)  # input name → user code
    gpu: str | None = None  # the GPU profile a simulated CUDA trace targeted, as the report names it
    gpu_capability: tuple[int, int] | None = None  # that GPU's compute capability (DD107 reads it)
    # Whether values were measured; why not, when they were not (fake tensors hold none).
    values: str = "measured"
    grads: tuple[GradStats, ...] = ()
    # The traced step is taken as a GradScaler would take it (scan's and diagnose's fp16 AMP check).
    grad_scaler: bool = False
    devices: DevicePlan | None = None  # the device map a multi-GPU simulation dispatched (--gpus/--device-map)
    world: World | None = None  # the process group a distributed step was traced in (rank 0 of N)
    shards: tuple[ShardGroup, ...] = ()  # the FSDP units of a sharded model
    launch: LaunchConfig | None = None  # the launcher command line and config files a run was given
    scaler: str | None = None  # the class of the GradScaler whose scale() the run's step called ("module.QualName")
    # Values a simulated step read from tensors without data, and what it took instead.
    stand_ins: tuple[StandIn, ...] = ()
    # What the trace reached of the step (None: worked out from the ops, see coverage_of).
    coverage: Coverage | None = None
    # How the model was loaded, when the doctor saw the load (scan, run): its dtype's origin, the attention asked for.
    loaded: LoadFacts | None = None
    # Files a simulated run held back from the user's file system (None: not a run under --simulate).
    writes: tuple[HeldWrite, ...] | None = None

    @property
    def values_measured(self) -> bool:
        return self.values == "measured"

    def input(self, name: str) -> TensorMeta | None:
        for t in self.inputs:
            if t.name == name:
                return t
        return None


@dataclass(frozen=True, slots=True)
class FixSuggestion:
    strategy: str
    applicability: str  # safe | unsafe | display-only
    description: str

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "applicability": self.applicability, "description": self.description}


@dataclass(frozen=True, slots=True)
class Remedy:
    """A fix a rule knows, as data: which strategy, applied to what, giving which dtype/device.

    `target` is a model input's name (cast-inputs, to-device), a module's dotted name or
    "model" (half-model, keep-fp32), "forward" (autocast) or "trainable" (fp32-trainable).
    `stage`/`source` say where in the pipeline the value should be changed, when known.
    """

    strategy: str
    target: str
    to: str  # a dtype or a device
    stage: str | None = None
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "target": self.target,
            "to": self.to,
            "stage": self.stage,
            "source": self.source.to_dict() if self.source else None,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    name: str
    severity: str
    message: str
    module: str = ""
    module_type: str = ""
    op: str | None = None
    stage: str = "model-code"
    tensors: tuple[TensorMeta, ...] = ()
    source: SourceLoc | None = None
    fixes: tuple[FixSuggestion, ...] = ()
    # PyTorch's own words when the op really raised; extra to SPEC's finding keys.
    pytorch_error: str | None = None
    # The fixes as data: what the fix strategies apply (extra to SPEC's finding keys).
    remedies: tuple[Remedy, ...] = ()
    # Shown, never applied: remedies and advice in words. With `remedies`, what `fixes` are
    # worded from (fix.strategies.worded: a rule states its fix as data, the strategies word it).
    hints: tuple[Remedy | str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """What stays the same when the same mismatch is found again (a baseline's key, SARIF's
        partialFingerprints): the rule, where in the model, the op, the stage and the tensors'
        names and roles. Not the message (it quotes measured values), the dtypes (they are the
        finding), shapes (the batch size) or source lines (they move as the file is edited)."""
        import hashlib

        tensors = ",".join(sorted(f"{t.role}={t.name or ''}" for t in self.tensors))
        source = self.source.file.replace("\\", "/") if self.source else ""
        key = "\0".join(("v1", self.code, self.module, self.op or "", self.stage, tensors, source))
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def to_dict(self) -> dict[str, Any]:
        d = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "module": self.module,
            "module_type": self.module_type,
            "op": self.op,
            "stage": self.stage,
            "tensors": [t.to_dict() for t in self.tensors],
            "source": self.source.to_dict() if self.source else None,
            "fixes": [f.to_dict() for f in self.fixes],
            "fingerprint": self.fingerprint,
        }
        if self.pytorch_error:
            d["pytorch_error"] = self.pytorch_error
        if self.remedies:
            d["remedies"] = [r.to_dict() for r in self.remedies]
        return d


@dataclass(frozen=True, slots=True)
class Loading:
    """What transformers' load report said about the checkpoint (SPEC addition: `target.loading`):
    weights the model needs that the files lack (initialised at random), weights the files hold
    that the model has no place for."""

    checkpoint: str  # the weight file(s), as named in the model directory
    expected: int  # weights the model's state dict holds
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()

    @property
    def missing_share(self) -> float:
        return len(self.missing) / self.expected if self.expected else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "expected": self.expected, "missing": list(self.missing),
                "unexpected": list(self.unexpected)}

    def warning(self) -> str | None:
        """One line for stderr, or None when every weight was found."""
        if not self.missing and not self.unexpected:
            return None
        parts = []
        if self.missing:
            parts.append(f"lacks {len(self.missing)} of the {self.expected} weights the model needs "
                         f"({_names(self.missing)}), which were initialised at random")
        if self.unexpected:
            parts.append(f"holds {len(self.unexpected)} the model has no place for ({_names(self.unexpected)})")
        return f"{self.checkpoint} " + "; it ".join(parts)


def _names(keys: tuple[str, ...], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (f", … {len(keys) - shown} more" if len(keys) > shown else "")


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What a device map puts on one device: weight bytes against the bytes it may use."""

    device: str  # cuda:k, cpu or disk
    weights: int  # bytes of the parameters and buffers placed there
    capacity: int | None  # the --gpu profile's memory or --max-memory's (None: disk)
    modules: int  # device-map entries placed there

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "weights": self.weights, "capacity": self.capacity, "modules": self.modules}


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """A device map as accelerate placed it: `strategy` auto|balanced|balanced_low_0|sequential|file,
    `gpus` simulated GPUs, `device_map` module → device, `devices` the load on each."""

    strategy: str
    gpus: int
    device_map: tuple[tuple[str, str], ...]
    devices: tuple[DeviceLoad, ...]

    @property
    def offloaded(self) -> tuple[tuple[str, str], ...]:
        """(module, cpu|disk): what accelerate streams onto a GPU at each forward."""
        return tuple((m, d) for m, d in self.device_map if d in ("cpu", "disk"))


@dataclass(frozen=True, slots=True)
class World:
    """The process group a distributed step is traced in: rank `rank` of `size`, on torch's fake backend."""

    size: int
    rank: int = 0
    backend: str = "fake"
    launcher: str | None = None  # torchrun | accelerate | None (the API)
    strategy: str | None = None  # fsdp2 | fsdp | deepspeed | ddp, when the step is sharded
    config: tuple[tuple[str, Any], ...] = ()  # the launch configuration's precision settings, as read

    def to_dict(self) -> dict[str, Any]:
        out = {"size": self.size, "rank": self.rank, "backend": self.backend, "launcher": self.launcher, "strategy": self.strategy}
        if self.config:
            out["config"] = dict(self.config)
        return out


@dataclass(frozen=True, slots=True)
class ShardGroup:
    """One FSDP unit as the traced step saw it: `fully_shard(module, mp_policy=...)` (fsdp2) or an
    FSDP1 FlatParameter (fsdp); its mixed-precision settings and the dtypes of the parameters it holds."""

    module: str  # "" for the root
    strategy: str  # fsdp2 | fsdp
    param_dtype: str | None
    reduce_dtype: str | None
    output_dtype: str | None
    cast_forward_inputs: bool
    trainable_dtypes: tuple[str, ...]  # the original dtypes of its trainable parameters, sorted
    frozen_dtypes: tuple[str, ...] = ()
    trainable: tuple[str, ...] = ()  # the first few trainable parameters, by name, one per dtype first
    flat: tuple[tuple[str, str], ...] = ()  # fsdp: (parameter, dtype) in the order FSDP1 flattens them, each dtype's first


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How a job is launched, as its launcher reads it: the command line and the accelerate / DeepSpeed
    config files it names. `refused` holds what accelerate or DeepSpeed raise for this configuration
    at launch, as (who, their message)."""

    launcher: str  # accelerate | torchrun | python (a plain script whose TrainingArguments were read)
    processes: int
    mixed_precision: str | None = None  # accelerate's: no | fp16 | bf16 | fp8
    distributed: str | None = None  # deepspeed | fsdp | multi_gpu
    config_file: str | None = None
    deepspeed_config: str | None = None
    ds_fp16: str | None = None  # "true" / "false" / "auto", as the DeepSpeed JSON has it
    ds_bf16: str | None = None
    zero_stage: int | None = None
    offload: tuple[str, ...] = ()  # "optimizer:cpu", "param:nvme"
    refused: tuple[tuple[str, str], ...] = ()
    trainer_args: bool = False  # the precision and DeepSpeed config come from the script's TrainingArguments


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    dataset: str | None
    split: str | None
    device: str
    simulated: bool
    model_dtype: str | None
    autocast: str | None
    train: bool
    gpu: str | None = None  # a simulated CUDA target's GPU profile, "a100 (compute capability 8.0)"
    loading: Loading | None = None  # only when the checkpoint lacked or had extra weights
    quantization: QuantizationInfo | None = None  # only for a quantized model
    devices: DevicePlan | None = None  # a simulated multi-GPU device map (--gpus/--device-map)
    world: World | None = None  # a distributed step: rank 0 of N (--gpus with a launcher, FSDP)
    loaded_dtype: LoadFacts | None = None  # SPEC `target.loaded_dtype`: the dtype loaded and where it came from
    attention: Mapping[str, Any] | None = None  # SPEC `target.attention`: the implementation, the SDPA backend CUDA picks
    components: tuple[Mapping[str, Any], ...] | None = None  # a pipeline's components: class, dtype, devices (SPEC addition)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"loading": self.loading.to_dict()} if self.loading is not None else {}
        if self.loaded_dtype is not None:
            extra["loaded_dtype"] = self.loaded_dtype.to_dict()
        if self.attention is not None:
            extra["attention"] = dict(self.attention)
        if self.components is not None:
            extra["components"] = [dict(c) for c in self.components]
        if self.quantization is not None:
            extra["quantization"] = self.quantization.to_dict()
        if self.devices is not None:
            extra["devices"] = [d.to_dict() for d in self.devices.devices]
            extra["device_map"] = {"strategy": self.devices.strategy, "gpus": self.devices.gpus, "map": dict(self.devices.device_map)}
        if self.world is not None:
            extra["world"] = self.world.to_dict()
        return {
            "model": self.model,
            "dataset": self.dataset,
            "split": self.split,
            "device": self.device,
            "simulated": self.simulated,
            "model_dtype": self.model_dtype,
            "autocast": self.autocast,
            "train": self.train,
            "gpu": self.gpu,
            **extra,
        }


@dataclass(frozen=True, slots=True)
class Subject:
    """What a report says was traced: the model and dataset as the user named them."""

    model: str | None = None
    dataset: str | None = None
    split: str | None = None


_CONTAINERS = frozenset({"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})


def coverage_of(trace: Trace) -> Coverage:
    """The trace's coverage: the one its driver recorded, else what its ops show (a forward, a
    loss op, a backward)."""
    if trace.coverage is not None:
        return trace.coverage
    phases = []
    if any(op.phase == "forward" for op in trace.ops) or trace.modules:
        phases.append("forward")
    backward = any(op.phase == "backward" for op in trace.ops)
    if backward or any("loss" in op.op for op in trace.ops):
        phases.append("loss")
    if backward:
        phases.append("backward")
    expected = ("forward", "loss", "backward") if trace.train else ("forward",)
    called = {m.name for m in trace.modules}
    # Containers (ModuleList, ModuleDict) are never called themselves: not counted as modules a step calls.
    callable_modules = [n for n, t in trace.model.module_types if t not in _CONTAINERS]
    total = max(len(callable_modules), len(called))
    stopped = None
    if trace.failure is not None:
        where = trace.failure.module or "the model"
        stopped = f"the {trace.failure.phase} stopped at {where}: {trace.failure.message}"
    return Coverage(tuple(phases), expected, len(called), total, len(trace.ops), len(trace.stand_ins), 1, stopped)


def summarize(findings: tuple[Finding, ...] | list[Finding], trace: Trace | None) -> dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f.severity] += 1
    counts["modules_traced"] = len({m.name for m in trace.modules}) if trace else 0
    counts["ops_traced"] = len(trace.ops) if trace else 0
    return counts


@dataclass(frozen=True, slots=True)
class Suppressed:
    """A finding held back from the report, and what held it: `comment` (the user's source line)
    or `baseline` (a --baseline file)."""

    finding: Finding
    by: str

    def to_dict(self) -> dict[str, Any]:
        f = self.finding
        return {"code": f.code, "severity": f.severity, "module": f.module, "message": f.message,
                "source": f.source.to_dict() if f.source else None, "fingerprint": f.fingerprint, "by": self.by}


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    target: Target
    environment: Mapping[str, Any]
    trace: Trace | None = None
    # The `fix` block of SPEC.md, set by `dtype-doctor fix` (a dtype_doctor.fix.outcome.FixOutcome).
    fix: FixOutcome | None = None
    # Findings held back by a `# dtype-doctor: ignore[...]` comment or a --baseline (report/suppress.py).
    suppressed: tuple[Suppressed, ...] = ()

    @property
    def lineage(self) -> Lineage:
        return self.trace.lineage if self.trace else {}

    @property
    def summary(self) -> dict[str, int]:
        return summarize(self.findings, self.trace)

    def blamed(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """input → lineage stage → codes of the findings whose remedy says the input went wrong there."""
        out: dict[str, dict[str, tuple[str, ...]]] = {}
        for f in self.findings:
            for r in f.remedies:
                if r.stage and r.target in self.lineage:
                    codes = out.setdefault(r.target, {}).get(r.stage, ())
                    if f.code not in codes:
                        out[r.target][r.stage] = (*codes, f.code)
        return out

    def at_or_above(self, severity: str) -> tuple[Finding, ...]:
        if severity == "never":
            return ()
        rank = SEVERITY_RANK[severity]
        return tuple(f for f in self.findings if SEVERITY_RANK[f.severity] >= rank)

    def _lineage_dict(self) -> dict[str, list[dict[str, Any]]]:
        """SPEC's lineage; a step a finding blames carries `blamed_by` (its codes)."""
        blamed = self.blamed()
        out = {}
        for name, steps in self.lineage.items():
            rows = []
            for s in steps:
                row = s.to_dict()
                if codes := blamed.get(name, {}).get(s.stage):
                    row["blamed_by"] = list(codes)
                rows.append(row)
            out[name] = rows
        return out

    def to_dict(self) -> dict[str, Any]:
        from dtype_doctor import __version__

        d: dict[str, Any] = {
            "schema_version": 1,
            "tool": {"name": "dtype-doctor", "version": __version__},
            "target": self.target.to_dict(),
            "environment": dict(self.environment),
            "findings": [f.to_dict() for f in self.findings],
            "lineage": self._lineage_dict(),
            "summary": self.summary,
        }
        if self.trace is not None:
            # Whether DD301-DD303 had values to judge: fake tensors (simulate) hold none.
            d["values"] = {"measured": self.trace.values_measured, "note": self.trace.values}
        if self.trace is not None:
            # What the trace reached of the step, and the values a simulation stood in for (additions to SPEC).
            d["coverage"] = coverage_of(self.trace).to_dict()
            d["stand_ins"] = [s.to_dict() for s in self.trace.stand_ins]
        if self.trace is not None and self.trace.writes is not None:
            d["writes"] = [w.to_dict() for w in self.trace.writes]  # held back by a simulated run (machine/disk.py)
        if self.trace and self.trace.failure:
            fl = self.trace.failure
            d["trace_failure"] = {
                "kind": fl.kind,
                "message": fl.message,
                "module": fl.module,
                "module_type": fl.module_type,
                "op": fl.op,
                "phase": fl.phase,
            }
        if self.suppressed:
            # Held back by a source comment or a baseline: counted, and listed so nothing is hidden silently.
            d["suppressed"] = {
                "total": len(self.suppressed),
                "comment": sum(s.by == "comment" for s in self.suppressed),
                "baseline": sum(s.by == "baseline" for s in self.suppressed),
                "findings": [s.to_dict() for s in self.suppressed],
            }
        if self.fix is not None:
            # Top-level findings and summary describe the pipeline as scanned, before the fix;
            # fix.before repeats that summary beside fix.after's, so neither is mistaken for the other.
            d["fix"] = {**self.fix.to_dict(), "before": {"summary": self.summary}}
        return d
