"""One traced step: each input's lineage through the pipeline, the trace's failure, the stand-ins
and held writes of a simulation, compiled regions, coverage, and the Trace itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from dtype_doctor.records.devices import DevicePlan, LaunchConfig, ShardGroup, World
from dtype_doctor.records.model import LoadFacts, ModelInfo
from dtype_doctor.records.tensors import GradStats, ModuleCall, OpCall, OptimizerGroup, TensorMeta

if TYPE_CHECKING:  # pragma: no cover
    from dtype_doctor.records.precision import PrecisionState
    from dtype_doctor.records.recompute import Recompute
    from dtype_doctor.records.resume import Resume, SavedCheckpoint


# Where a dtype or device can come from, in pipeline order. "formatter" (the datasets
# torch/numpy formatter) is an addition to the list docs/rules.md gives for DD108: it silently casts fp16 → fp32
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
# An input's lineage: the pipeline's stages up to the transfer, then the model's boundary.
LINEAGE_STAGES = (*STAGES[: STAGES.index("transfer") + 1], "model-boundary")


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
    # False where user code only first saw a dtype a library had already decided (`torch.stack` of
    # a transform's tensors): that line is where the tensor appeared, not where its dtype was chosen.
    decided: bool = True

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
    # Of those calls, the ones run unwatched (the recorder off, at the script's own pace): a real run's repeats
    # while nothing in the step needed a repair (docs/report.md).
    unwatched: int = 0
    # The CUDA API calls a simulated run made that the simulation does not answer (machine/cuda_api.py).
    not_simulated: tuple[str, ...] = ()
    # (layer, the identical layer whose trace it shares) in a simulated forward (trace/layer_share.py).
    shared_layers: tuple[tuple[str, str], ...] = ()

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
            **({"skipped": {"calls": dict(self.skipped), "ops": self.dropped_ops,
                            **({"unwatched": self.unwatched} if self.unwatched else {})}} if self.skipped else {}),
            **({"not_simulated": list(self.not_simulated)} if self.not_simulated else {}),
            **({"shared_layers": [{"layer": a, "same_as": b} for a, b in self.shared_layers]} if self.shared_layers else {}),
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
    macos: tuple[int, int] | None = None  # a simulated Apple-silicon (mps) trace's macOS version (DD120/DD121 read it)
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
    scaler_off: SourceLoc | None = None  # the user's line that made a disabled GradScaler (a run's; DD403 names it)
    optimizers: tuple[OptimizerGroup, ...] = ()  # the param groups of the optimizers a run's script made
    # Values a simulated step read from tensors without data, and what it took instead.
    stand_ins: tuple[StandIn, ...] = ()
    # What the trace reached of the step (None: worked out from the ops, see coverage_of).
    coverage: Coverage | None = None
    # How the model was loaded, when the doctor saw the load (scan, run): its dtype's origin, the attention asked for.
    loaded: LoadFacts | None = None
    # Files a simulated run held back from the user's file system (None: not a run under --simulate).
    writes: tuple[HeldWrite, ...] | None = None
    # The process's precision switches when the step ran, and who set them (records/precision.py).
    precision: PrecisionState | None = None
    # Activation checkpointing's recompute against its forward (records/recompute.py); None: no checkpointed region ran.
    recompute: Recompute | None = None
    # A resume the step came after: the load_state_dict calls, what they cast, optimizer state against its parameters.
    resume: Resume | None = None
    # The checkpoint `scan --checkpoint` compared with the model: its saved dtypes, read without loading it.
    checkpoint: SavedCheckpoint | None = None
    # Layers of a simulated forward that shared an identical layer's trace: (layer, same as).
    shared_layers: tuple[tuple[str, str], ...] = ()

    @property
    def on_mac(self) -> bool:
        """Whether the machine asked for is Apple silicon (a simulated `--device mps`, or a real mps), even where
        the model itself sits on the CPU: the report speaks of that machine, never of CUDA."""
        return self.macos is not None or self.device.startswith("mps")

    @property
    def values_measured(self) -> bool:
        return self.values == "measured"

    def input(self, name: str) -> TensorMeta | None:
        for t in self.inputs:
            if t.name == name:
                return t
        return None


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
    return Coverage(tuple(phases), expected, len(called), total, len(trace.ops), len(trace.stand_ins), 1, stopped,
                    shared_layers=trace.shared_layers)
