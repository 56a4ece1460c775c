"""The drivers over the trace: `diagnose`, `watch`, and the Report a Trace becomes.

trace/ records a step (trace/engine.py `trace_model` for a batch, trace/session.py's
TraceSession for any code); the rules judge the Trace; this module puts the two together for
the API, `dtype-doctor run` and compare, and names the environment the report was made in.
"""

from __future__ import annotations

import functools
from dataclasses import replace
import platform
from pathlib import Path
from typing import Any, Mapping

import torch

from dtype_doctor.rules.attention import attention_of
from dtype_doctor.rules.components import components_of
from dtype_doctor.records import Finding, Lineage, ModelInfo, Report, SourceLoc, Subject, Target, Trace, TraceFailure
from dtype_doctor.trace.engine import holds_no_data, model_info, trace_model, values_note
from dtype_doctor.trace.session import TraceSession
from dtype_doctor.trace.request import TraceRequest
from dtype_doctor.machine.placement import Placement, decide


def environment() -> dict[str, Any]:
    """The versions and the CUDA availability a report was made with (a fresh dict each call)."""
    return dict(_environment())


@functools.cache
def _environment() -> tuple[tuple[str, Any], ...]:
    # Read once per process: looking installed versions up costs more than a small model's rules.
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    for lib in ("transformers", "datasets"):
        env[lib] = _version(lib)
    env["cuda_available"] = torch.cuda.is_available()
    return tuple(env.items())


def _version(lib: str) -> str | None:
    """An installed library's version, without importing it (the API on a bare model never needs
    datasets, whose import costs seconds: pandas, pyarrow)."""
    import sys
    from importlib import metadata

    module = sys.modules.get(lib)
    if module is not None and isinstance(getattr(module, "__version__", None), str):
        return module.__version__
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return None


def _target(trace: Trace, model: torch.nn.Module, subject: Subject | None) -> Target:
    subject = subject or Subject()
    return Target(
        model=subject.model or trace.model.class_name or type(model).__name__,
        dataset=subject.dataset,
        split=subject.split,
        device=trace.device,
        simulated=trace.simulated,
        model_dtype=trace.model.main_dtype,
        autocast=trace.autocast,
        train=trace.train,
        gpu=trace.gpu,
        quantization=trace.model.quantization,
        devices=trace.devices,
        world=trace.world,
        loaded_dtype=trace.loaded,
        attention=attention_of(trace, _real_capability(trace)),
        components=components_of(trace.model),
    )


def _real_capability(trace: Trace) -> tuple[int, int] | None:
    """The compute capability of the GPU a real (not simulated) CUDA trace ran on."""
    if trace.simulated or not trace.device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(torch.device(trace.device)))  # type: ignore[return-value]


def judged(trace: Trace, *, select: Any = None, ignore: Any = None) -> tuple[Finding, ...]:
    """The rules' findings on `trace`, their fixes worded by the strategies."""
    from dtype_doctor.fix.strategies import worded
    from dtype_doctor.rules import run_rules

    return worded(run_rules(trace, select=select, ignore=ignore))


def report_from_trace(trace: Trace, model: torch.nn.Module, request: TraceRequest | None = None) -> Report:
    request = request or TraceRequest()
    if trace.precision is None:  # scan: the switches as the process holds them (run saw who set them)
        from dtype_doctor.machine.precision_state import current_state

        trace = replace(trace, precision=current_state())
    findings = judged(trace, select=request.select, ignore=request.ignore)
    return Report(findings=findings, target=_target(trace, model, request.subject), environment=environment(), trace=trace)


def with_checkpoint(report: Report, saved: Any, *, select: Any = None, ignore: Any = None) -> Report:
    """`report` compared with a checkpoint's saved dtypes (scan --checkpoint; load.checkpoint.saved_dtypes,
    read without loading its tensors): on the trace, and DD406's findings added."""
    from dtype_doctor.rules import parse_codes

    if report.trace is None:
        return report
    trace = replace(report.trace, checkpoint=saved)
    ignored = set(parse_codes(ignore) or ())
    chosen = set(parse_codes(select) or ()) or None
    if any("DD406".startswith(c) for c in ignored) or (chosen is not None and not any("DD406".startswith(c) for c in chosen)):
        return replace(report, trace=trace)
    added = tuple(f for f in judged(trace, select=("DD406",)) if not any(f.message == g.message for g in report.findings))
    return replace(report, trace=trace, findings=report.findings + added)


# The API's keywords that say where the step runs: decided into one Placement, here, at the entry.
PLACEMENT_KEYWORDS = ("device", "simulate", "gpu", "gpus", "device_map", "max_memory")


def as_request(request: TraceRequest | None, options: Mapping[str, Any]) -> TraceRequest:
    """A TraceRequest, or one built from its keyword options (autocast=, train=, ...) and the
    placement keywords (device=, simulate=, gpu=, gpus=, device_map=, max_memory=)."""
    if request is not None and options:
        raise TypeError(f"pass a TraceRequest or keyword options, not both (got {', '.join(options)})")
    if request is not None:
        return request
    where = {k: options[k] for k in PLACEMENT_KEYWORDS if k in options}
    rest = {k: v for k, v in options.items() if k not in where}
    return TraceRequest(placement=placement_of(**where), **rest)


def placement_of(device: str | None = None, simulate: bool = False, gpu: str | None = None, gpus: int = 1,
                 device_map: Any = None, max_memory: Any = None) -> Placement:
    """The API's Placement: `device` None (or "auto" on real tensors) traces where the model is, or
    where a fake model says it is (cuda:0 for one on meta)."""
    placement = decide(None if device == "auto" and not simulate else device, simulate=simulate, gpu=gpu, gpus=gpus,
                       device_map=device_map, max_memory=max_memory)
    return replace(placement, device=None) if device is None else placement


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
    from dtype_doctor.rules import refusal

    return report_from_trace(trace_model(model, inputs, request, refusal=refusal), model, request)


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
        self._session: TraceSession

    def __enter__(self) -> "watch":
        self._session = TraceSession(self.model, recover=not self.raise_errors,
                                     stats=self.request.stats and not holds_no_data(self.model, {}))
        self._info = model_info(self.model)
        self._session.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        session = self._session
        session.stop()
        trace = live_trace(session, self._info, session.failure(exc) if exc is not None else None)
        self.report = report_from_trace(trace, self.model, self.request)
        if exc is not None:
            _explain(exc, self.report)
        return False  # the user's exception still propagates


def live_trace(
    session: TraceSession,
    info: ModelInfo,
    failure: TraceFailure | None,
    *,
    lineage: Lineage | None = None,
    sources: Mapping[str, SourceLoc] | None = None,
) -> Trace:
    """The Trace of what a session saw the user's own code run (watch(), `dtype-doctor run`).

    No gradients: by the time the user's step ends, their GradScaler has scaled and unscaled
    them and their optimizer may have cleared them, so what is left says nothing about
    underflow. DD302's gradient check belongs to traces that take the step themselves."""
    params = list(session.model.parameters())
    fake = bool(params) and holds_no_data(session.model, {})
    return session.trace(info, failure, lineage=lineage, sources=sources,
                         values=values_note(TraceRequest(stats=session.recorder.values is not None), fake))


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
