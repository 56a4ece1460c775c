"""The report of a script that stopped on a TF32 read PyTorch refused before it called a model:
the process's precision state, its refused reads (DD114), no step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtype_doctor.records.errors import first_line
from dtype_doctor.records import ModelInfo, Report, Target, Trace, TraceFailure

if TYPE_CHECKING:
    from dtype_doctor.run.command import ScriptCommand
    from dtype_doctor.run.runner import RunOptions
    from dtype_doctor.run.session import RunSession


def refused_read_report(error: BaseException, session: "RunSession", command: "ScriptCommand", options: "RunOptions") -> Report | None:
    """The report of `error` when it is a TF32 read the session's watch saw PyTorch refuse, else None."""
    from dtype_doctor.diagnosis import environment, judged
    watch = session.precision
    if not watch.owns(error):
        return None
    gpu = options.placement.profile if options.placement.simulated else None
    failure = TraceFailure("other", f"{type(error).__name__}: {first_line(error)}", "", "", None, phase="setup")
    trace = Trace((), (), ModelInfo("", ()), (), device=options.placement.device or "cpu", simulated=options.placement.simulated,
                  failure=failure, values="not measured: the script stopped before calling a model",
                  gpu=str(gpu) if gpu is not None else None, gpu_capability=getattr(gpu, "capability", None),
                  precision=watch.state())
    findings = judged(trace, select=options.select, ignore=options.ignore)
    target = Target(command.display, None, None, trace.device, trace.simulated, None, None, False, gpu=trace.gpu)
    return Report(findings=findings, target=target, environment=environment(), trace=trace)
