"""`diagnose()` and `watch()`: trace a model, run the rules, return a Report.

Both leave the model as they found it: parameters, buffers, requires_grad, gradients,
train/eval flags and devices. Simulated traces never touch the model's tensors at all:
they run `torch.func.functional_call` with fake copies of its state.
"""

from __future__ import annotations

import contextlib
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from dtype_doctor.errors import is_out_of_memory
from dtype_doctor.records import (
    GradStats,
    Lineage,
    ModelInfo,
    Report,
    SourceLoc,
    StateTensor,
    Subject,
    Target,
    Trace,
    TraceFailure,
    TraceRequest,
)
from dtype_doctor.numerics import device_name, dtype_name, loss_of
from dtype_doctor.placement import decide, parse_device
from dtype_doctor.trace.guard import preserved
from dtype_doctor.trace.recorder import Recorder
from dtype_doctor.trace.verdicts import classify_error

AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for lib in ("transformers", "datasets"):
        try:
            env[lib] = __import__(lib).__version__
        except ImportError:
            env[lib] = None
    env["cuda_available"] = torch.cuda.is_available()
    return env


def model_info(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor] | None = None,
    device_alias: Mapping[str, str] | None = None,
) -> ModelInfo:
    non_persistent: set[str] = set()
    for mname, mod in model.named_modules():
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            non_persistent.add(f"{mname}.{b}" if mname else b)
    entries: list[StateTensor] = []
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            t = state.get(name, t) if state else t
            entries.append(
                StateTensor(
                    name=name,
                    kind=kind,
                    dtype=dtype_name(t.dtype),
                    device=(device_alias or {}).get(device_name(t.device), device_name(t.device)),
                    shape=tuple(t.shape),
                    requires_grad=bool(t.requires_grad),
                    persistent=name not in non_persistent,
                )
            )
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) + tuple(
        getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    )
    config = getattr(model, "config", None)
    num_labels = getattr(config, "num_labels", None)
    problem_type = getattr(config, "problem_type", None)
    return ModelInfo(
        class_name=type(model).__name__,
        state=tuple(entries),
        keep_in_fp32_modules=keep,
        module_types=tuple((n, type(m).__name__) for n, m in model.named_modules()),
        num_labels=num_labels if isinstance(num_labels, int) else None,
        problem_type=problem_type if isinstance(problem_type, str) else None,
    )


def _moved_state(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Copies of the model's parameters and buffers on `device`, as leaves that keep requires_grad."""
    state: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        state[name] = p.detach().to(device).requires_grad_(p.requires_grad)
    for name, b in model.named_buffers():
        state[name] = b.detach().to(device)
    return state


def _rules_predict(op: Any) -> str | None:
    """Where a real device would raise: the first rule that says it rejects the op."""
    from dtype_doctor.rules import rejected_by

    rule = rejected_by(op)
    return None if rule is None else f"a real device would raise here ({rule.code} {rule.name})"


def _holds_no_data(model: torch.nn.Module, inputs: Mapping[str, Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [*model.parameters(), *(v for v in inputs.values() if isinstance(v, torch.Tensor))]
    return any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors)


def _declared_device(model: torch.nn.Module) -> torch.device | None:
    """The device a fake model says it is on (a meta model declares none)."""
    p = next(model.parameters(), None)
    if p is None or p.device.type == "meta":
        return None
    return p.device


def simulation_device(target: torch.device, autocast: str | None) -> torch.device:
    """The device simulated tensors live on for a `target` device.

    A CUDA build of torch (with or without a GPU) fakes CUDA tensors faithfully. A CPU-only
    build cannot: its Python bindings (indexing, .to, .contiguous) build a CUDA device guard
    that does not exist and abort. There the trace runs on `meta` labelled with the target,
    so tensors created in forward without device= still land on the CPU and show up as device
    mismatches; autocast is then CUDA's policy applied by the recorder (trace/cuda_autocast.py).
    """
    if target.type != "cuda" or torch.version.cuda is not None:
        return target
    return torch.device("meta")


def fake_like(fake_mode: Any, t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A fake tensor with t's dtype, shape and requires_grad on `device` (CUDA works without a GPU)."""
    with fake_mode:
        out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out


@dataclass(frozen=True)
class Where:
    """How one trace runs the Placement decided at the boundary: real or fake tensors, the device
    the report names, and where the tensors live (the label, or its simulation stand-in)."""

    simulate: bool
    label: torch.device | None  # the device the report names; None: wherever the model is
    run_on: torch.device | None


def place(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest) -> Where:
    """A model holding fake or meta tensors can only be simulated; without a device the trace runs
    where the model is. A CUDA device this machine lacks is refused by placement.decide."""
    simulate = request.simulate or _holds_no_data(model, inputs)
    asked = parse_device(None if request.device in (None, "auto") else request.device)
    if simulate:
        label = torch.device(asked) if asked else (_declared_device(model) or torch.device("cuda", 0))
        return Where(True, label, simulation_device(label, request.autocast))
    if asked is not None:
        decide(asked)
    target = torch.device(asked) if asked else None
    return Where(False, target, target)


def settle(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest) -> TraceRequest:
    """The request with its device and simulation decided, so re-traces of changed copies
    (a fix's candidates) run where the first trace ran."""
    where = place(model, inputs, request)
    device = device_name(where.label) if where.label is not None else request.device
    return request.with_(simulate=where.simulate, device=device)


def trace_model(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest | None = None) -> Trace:
    """Run one forward (and with request.train one backward) under the recorder.

    With request.move_inputs False the inputs stay on their own devices (a batch the
    pipeline forgot to move), so a model on the device meets them as it would for real.
    """
    request = request or TraceRequest()
    inputs = dict(inputs.items())
    autocast = request.autocast
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        from dtype_doctor.errors import UsageError

        raise UsageError(f"--autocast must be off, float16 or bfloat16, not {autocast!r}")
    where = place(model, inputs, request)
    fake_mode = None
    state: dict[str, torch.Tensor] | None = None
    target_device = where.label
    alias: dict[str, str] = {}
    autocast_device: str | None = None
    if where.simulate:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        label, stand_in = where.label, where.run_on
        if stand_in != label:
            alias[device_name(stand_in)] = device_name(label)
            autocast_device = stand_in.type
        state = {n: fake_like(fake_mode, t, stand_in) for n, t in [*model.named_parameters(), *model.named_buffers()]}
        def sim_device(v: torch.Tensor) -> torch.device:
            # Simulation the caller did not ask for (a meta input, a fake model) moves nothing:
            # an input left on another device is the mismatch to report.
            keep = not request.move_inputs or not request.simulate
            stays = keep and device_name(v.device) != device_name(label)
            return v.device if stays else stand_in

        inputs = {k: (fake_like(fake_mode, v, sim_device(v)) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        target_device = None
    elif target_device is not None:
        if any(t.device != target_device for t in [*model.parameters(), *model.buffers()]):
            state = _moved_state(model, target_device)
        if request.move_inputs:
            inputs = {k: (v.to(target_device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}

    predict = None
    if where.simulate:
        from dtype_doctor.trace.gpus import gpu_profile
        from dtype_doctor.trace.probe import KernelProbe

        cuda = where.label is not None and where.label.type == "cuda"
        predict = KernelProbe(cuda=cuda, gpu=gpu_profile(request.gpu) if cuda else None, fallback=_rules_predict)
    from dtype_doctor.trace.values import ValueProbe

    values = ValueProbe() if request.stats and not where.simulate else None
    rec = Recorder(model, state=state, device_alias=alias, predict=predict, values=values)
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            rec.tag_input(name, v)
    info = model_info(model, state, alias)
    run_device = where.run_on if where.simulate and where.run_on is not None else _run_device(model, state, target_device)
    amp_device = autocast_device or run_device.type
    # No AutocastCUDA kernels on a CPU-only build, and CPU autocast's lists are not CUDA's.
    emulate_cuda_amp = where.simulate and where.label is not None and where.label.type == "cuda" and run_device.type != "cuda"
    failure: TraceFailure | None = None
    grads: list[tuple[str, str, int | None]] = []
    with preserved(model, train=request.train, guard_writes=state is None):
        rec.attach()
        try:
            with contextlib.ExitStack() as stack:
                if fake_mode is not None:
                    stack.enter_context(_quiet_fake_kernels())
                    stack.enter_context(fake_mode)
                stack.enter_context(rec.function_mode())
                stack.enter_context(rec.dispatch_mode())
                stack.enter_context(torch.enable_grad() if request.train else torch.no_grad())
                with contextlib.ExitStack() as amp:
                    if autocast and emulate_cuda_amp:
                        from dtype_doctor.trace.cuda_autocast import CudaAutocast

                        rec.amp = amp.enter_context(CudaAutocast(AUTOCAST_DTYPES[autocast]))
                        amp.callback(setattr, rec, "amp", None)
                    elif autocast:
                        amp.enter_context(torch.autocast(amp_device, dtype=AUTOCAST_DTYPES[autocast]))
                    if state is not None:
                        out = torch.func.functional_call(model, state, (), inputs, strict=False)
                    else:
                        out = model(**inputs)
                if request.train:
                    loss = loss_of(out, "sum")
                    if loss is not None and loss.requires_grad:
                        loss.backward()
                        grads = _observe_grads(rec, state if state is not None else dict(model.named_parameters()))
        except Exception as exc:  # noqa: BLE001 - a failed trace is a finding, not a crash
            if is_out_of_memory(exc):
                raise  # the machine's limit, not the model's: the caller names the batch size
            failure = _failure(rec, exc)
        finally:
            rec.detach()
    return Trace(
        ops=rec.finished_ops(),
        modules=rec.finished_modules(),
        model=info,
        inputs=tuple(rec.boundary_inputs) or tuple(rec.meta(v, "input", k) for k, v in inputs.items() if isinstance(v, torch.Tensor)),
        lineage=dict(request.lineage),
        device=alias.get(device_name(run_device), device_name(run_device)),
        simulated=where.simulate,
        autocast=autocast,
        train=request.train,
        failure=failure,
        sources=dict(request.sources),
        gpu=str(predict.gpu) if predict is not None and predict.gpu is not None else None,
        gpu_capability=predict.gpu.capability if predict is not None and predict.gpu is not None else None,
        values=_values_note(request, where.simulate),
        grads=_resolved_grads(rec, grads),
        # scan's fp16 AMP step is checked as a GradScaler would take it (DD401).
        grad_scaler=request.train and autocast == "float16",
    )


@contextlib.contextmanager
def _quiet_fake_kernels() -> Iterable[None]:
    """Fake tensors log a traceback for every meta kernel that raises; the recorder handles
    those errors (records, repairs), so the user's stderr should not show them."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _values_note(request: TraceRequest, simulated: bool) -> str:
    if simulated:
        return "not measured: a simulated trace runs on fake tensors, which hold no values"
    return "measured" if request.stats else "not measured: statistics were turned off"


def _observe_grads(rec: Recorder, params: Mapping[str, torch.Tensor]) -> list[tuple[str, str, int | None]]:
    """Handles for each trainable parameter's gradient after the backward."""
    if rec.values is None:
        return []
    named = [(n, p) for n, p in params.items() if isinstance(p, torch.Tensor) and p.grad is not None]
    handles = rec.observe(p.grad for _, p in named)
    return [(n, dtype_name(p.grad.dtype), h) for (n, p), h in zip(named, handles)]


def _resolved_grads(rec: Recorder, grads: list[tuple[str, str, int | None]]) -> tuple[GradStats, ...]:
    if rec.values is None:
        return ()
    return tuple(GradStats(n, d, s) for n, d, h in grads if (s := rec.values.get(h)) is not None)


def _run_device(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None, target: torch.device | None) -> torch.device:
    if target is not None:
        return target
    tensors = list(state.values()) if state else list(model.parameters())
    return tensors[0].device if tensors else torch.device("cpu")


def _failure(rec: Recorder, exc: BaseException) -> TraceFailure:
    from dtype_doctor.trace.recorder import _first_line

    message = _first_line(exc)
    if type(exc).__name__ in _SIMULATION_LIMITS or (rec.predict is not None and _NO_META_KERNEL in message):
        module, module_type = _raising_module(rec, exc)
        return TraceFailure("simulation", f"fake tensors cannot follow this step ({type(exc).__name__}: {message})", module, module_type, None)
    last = next((op for op in reversed(rec.ops) if op.error and not op.recovered), None)
    if last is not None:
        return TraceFailure(classify_error(last.error or message, last.operands), message, last.module, last.module_type, last.op, last.phase)
    module, module_type = _raising_module(rec, exc)
    return TraceFailure(classify_error(message, ()), message, module, module_type, None)


# Fake tensors have no values: these are steps a simulated trace cannot take.
_NO_META_KERNEL = "with Meta tensors"  # an op PyTorch gives no shape function (geqrf, histogram)
_SIMULATION_LIMITS = ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException")


def _raising_module(rec: Recorder, exc: BaseException) -> tuple[str, str]:
    """The innermost module whose forward was on the stack when `exc` was raised."""
    import traceback

    found = ("", type(rec.model).__name__)
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        owner = frame.f_locals.get("self")
        name = rec.module_name(owner) if isinstance(owner, torch.nn.Module) else None
        if name is not None:
            found = (name, type(owner).__name__)
    return found


def _target(trace: Trace, model: torch.nn.Module, subject: Subject | None) -> Target:
    subject = subject or Subject()
    return Target(
        model=subject.model or type(model).__name__,
        dataset=subject.dataset,
        split=subject.split,
        device=trace.device,
        simulated=trace.simulated,
        model_dtype=trace.model.main_dtype,
        autocast=trace.autocast,
        train=trace.train,
        gpu=trace.gpu,
    )


def report_from_trace(trace: Trace, model: torch.nn.Module, request: TraceRequest | None = None) -> Report:
    from dtype_doctor.rules import run_rules

    request = request or TraceRequest()
    findings = run_rules(trace, select=request.select, ignore=request.ignore)
    return Report(findings=findings, target=_target(trace, model, request.subject), environment=environment(), trace=trace)


def as_request(request: TraceRequest | None, options: Mapping[str, Any]) -> TraceRequest:
    """A TraceRequest, or one built from TraceRequest's keyword options (device=, autocast=, ...)."""
    if request is not None and options:
        raise TypeError(f"pass a TraceRequest or keyword options, not both (got {', '.join(options)})")
    return request if request is not None else TraceRequest(**options)


def diagnose(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest | None = None, **options: Any) -> Report:
    """Trace `model(**inputs)` once (and one backward with train=True) and run every rule.

    `inputs` is a dict of tensors, a BatchEncoding or a BatchFeature. Options are a
    TraceRequest or its fields as keywords: `device` runs the trace there, on copies of the
    model's state (the model itself is not moved); `simulate=True` traces with fake tensors
    on `device` (default: the model's device, or cuda:0 for a model without data), reading
    no tensor data; `move_inputs=False` leaves the inputs on their own devices instead of
    moving them to `device` with the model; `gpu` ("t4", "a100", "8.0") is the GPU a simulated
    CUDA trace targets; `autocast`, `train`, `select`, `ignore` as the CLI.
    """
    request = as_request(request, options)
    return report_from_trace(trace_model(model, inputs, request), model, request)


class watch:
    """Trace whatever forward/backward runs inside the block.

        with dtype_doctor.watch(model) as w:
            loss = model(**batch).loss
            loss.backward()
        print(w.report.findings)

    The block runs as it would without the doctor: an error PyTorch raises still propagates,
    but `w.report` is set either way, and the exception carries the report
    (`exc.dtype_doctor_report`) and a note naming the findings, with the doctor's own frames
    taken out of its traceback. With `raise_errors=False` dtype and device errors are repaired
    as in `diagnose()` and the block runs on.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        request: TraceRequest | None = None,
        *,
        raise_errors: bool = True,
        **options: Any,
    ) -> None:
        self.model = model
        self.request = as_request(request, options)  # select / ignore: the block itself runs as written
        self.raise_errors = raise_errors
        self.report: Report | None = None
        self._rec: Recorder | None = None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> "watch":
        from dtype_doctor.trace.values import ValueProbe

        probe = ValueProbe() if self.request.stats and not _holds_no_data(self.model, {}) else None
        self._rec = Recorder(self.model, recover=not self.raise_errors, values=probe)
        self._info = model_info(self.model)
        self._rec.attach()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self._rec.function_mode())
        self._stack.enter_context(self._rec.dispatch_mode())
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        assert self._rec is not None and self._stack is not None
        self._stack.close()
        self._rec.detach()
        trace = live_trace(self._rec, self._info, _failure(self._rec, exc) if exc is not None else None)
        self.report = report_from_trace(trace, self.model, self.request)
        if exc is not None:
            _explain(exc, self.report)
        return False  # the user's exception still propagates


def live_trace(
    rec: Recorder,
    info: ModelInfo,
    failure: TraceFailure | None,
    *,
    lineage: Lineage | None = None,
    sources: Mapping[str, SourceLoc] | None = None,
) -> Trace:
    """The Trace of what a recorder saw the user's own code run (watch(), `dtype-doctor run`)."""
    params = list(rec.model.parameters())
    fake = bool(params) and _holds_no_data(rec.model, {})
    return Trace(
        ops=rec.finished_ops(),
        modules=rec.finished_modules(),
        model=info,
        inputs=tuple(rec.boundary_inputs),
        lineage=dict(lineage or {}),
        device=device_name(params[0].device) if params else "cpu",
        autocast=next((op.autocast for op in rec.ops if op.autocast), None),
        train=any(op.phase == "backward" for op in rec.ops),
        failure=failure,
        sources=dict(sources or {}),
        values=_values_note(TraceRequest(stats=rec.values is not None), fake),
        # No gradients: by the time the user's step ends, their GradScaler has scaled and
        # unscaled them and their optimizer may have cleared them, so what is left says nothing
        # about underflow. DD302's gradient check belongs to traces that take the step themselves.
    )


def _explain(exc: BaseException, report: Report) -> None:
    """Attach the report to `exc`, name its findings in a note, drop the doctor's frames."""
    import dtype_doctor

    try:
        exc.dtype_doctor_report = report  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__
        pass
    shown = [f for f in report.findings if f.severity != "info"]
    if shown:
        lines = [f"dtype-doctor found {len(shown)} problem{'s' if len(shown) != 1 else ''} in this step:"]
        lines += [f"  {f.code} {f.severity} at {f.module or '<model>'}: {f.message}" for f in shown]
        exc.add_note("\n".join(lines))
    package = str(Path(dtype_doctor.__file__).parent)
    exc.__traceback__ = _without_frames_from(exc.__traceback__, package)


def _without_frames_from(tb: Any, directory: str) -> Any:
    """The traceback `tb` without the frames whose code lives under `directory`."""
    import types

    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(directory):
            frames.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for t in reversed(frames):
        rebuilt = types.TracebackType(rebuilt, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return rebuilt
