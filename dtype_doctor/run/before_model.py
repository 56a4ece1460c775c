"""A script that stopped on a torch call of its own before calling any model, judged from that call.

`x.mm(W)` on float64 data the script made from numpy raises before the model ever runs (the
plain script fails the same way on any machine). The lineage mode saw the call that raised
(`LineageBook.raised`) and the chain of each operand, so the call is judged by the same rules
as a model's ops, named at the user's line where the odd dtype or device was decided, and fixed
there (`fix --run`: the cast on that line). A call the rules find nothing wrong with (an error
that is not about dtypes or devices) is left to the caller, which names the error as it was.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import TYPE_CHECKING, Any

import torch

from dtype_doctor.machine.user_code import display_path, is_user_file
from dtype_doctor.numerics import dtype_name
from dtype_doctor.records import Report, Target
from dtype_doctor.records.errors import first_line
from dtype_doctor.records.tensors import FLOATING, OpCall, TensorMeta
from dtype_doctor.records.trace import Coverage, ModelInfo, Trace, TraceFailure
from dtype_doctor.run.lineage import Chain, LineageBook, Raised, sources_of

if TYPE_CHECKING:
    from dtype_doctor.run.command import ScriptCommand
    from dtype_doctor.run.runner import RunOptions

WHERE = "the script"  # what the finding names as its module: no model ran


def raised_report(book: LineageBook, error: BaseException, command: "ScriptCommand", options: "RunOptions") -> Report | None:
    """The report of the torch call that stopped the script before any model call, when the rules
    name a dtype or device problem in it; None for any other error."""
    raised = book.raised
    if raised is not None and _caused_by(error, raised.error):
        trace = raised_trace(book, raised, simulated=options.placement.simulated)
    elif (collated := collation_trace(book, error, simulated=options.placement.simulated)) is not None:
        trace = collated
    else:
        return None
    from dtype_doctor.diagnosis import environment, judged

    # Only a dtype or device problem the rules name; DD001 (a failure for another reason) stays the script's error.
    findings = tuple(f for f in judged(trace, select=options.select, ignore=options.ignore)
                     if f.severity == "error" and f.code != "DD001")
    if not findings:
        return None
    gpu = options.placement.profile if options.placement.simulated else None
    target = Target(command.display, None, None, trace.device, trace.simulated, None, None, False,
                    gpu=str(gpu) if gpu is not None else None)
    return Report(findings=findings, target=target, environment=environment(), trace=dataclasses.replace(trace, gpu=target.gpu))


def raised_trace(book: LineageBook, raised: Raised, *, simulated: bool = False) -> Trace:
    """One op, the call that raised, its operands named as the user's frame names them (`x`,
    `W_target`), with the chains the lineage kept for them."""
    frame = _user_frame(raised.error)
    names = _names(frame, raised.operands)
    default = dtype_name(torch.get_default_dtype())
    metas: list[TensorMeta] = []
    lineage: dict[str, Chain] = {}
    for i, t in enumerate(raised.operands):
        name = names.get(id(t)) or f"operand {i + 1}"
        if book.chain(t):
            lineage[name] = book.chain(t)
        metas.append(TensorMeta(dtype_name(t.dtype), book.device(t.device), tuple(t.shape), "input", name, f"input:{name}"))
    # The operands in torch's default dtype first: the op is read as computing in it, so float64
    # data from numpy is what gets cast (never the script's float32 weights to float64).
    metas.sort(key=lambda m: m.dtype != default)
    op = f"aten.{_aten_name(raised.op)}.default"
    message = first_line(raised.error)
    from dtype_doctor.trace.verdicts import classify_error

    line = f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else ""
    failure = TraceFailure(classify_error(message, tuple(metas)), message, line, WHERE, op, phase="setup")
    coverage = Coverage((), ("forward",), 0, 0, 1, stopped=f"the script raised{' at ' + line if line else ''} before calling a model")
    devices = [m.device for m in metas if m.device != "cpu"]
    return Trace((OpCall(0, op, "", WHERE, tuple(metas), error=message),), (), ModelInfo(WHERE, ()), tuple(metas),
                 lineage=lineage, sources=sources_of(lineage), device=devices[0] if devices else "cpu", simulated=simulated,
                 failure=failure, coverage=coverage, values="not measured: the script stopped before calling a model")


def collation_trace(book: LineageBook, error: BaseException, *, simulated: bool = False) -> Trace | None:
    """A library refused the batch (a tokenizer's `pad` on float token ids) while a column the model
    looks up as indices holds floating values the user's map function made: those columns, their lines."""
    from dtype_doctor.rules.dd103_index_dtype import INDEX_COLUMNS

    frame = _user_frame(error)
    last = _innermost(error)
    if last is None or is_user_file(last.f_code.co_filename):
        return None  # the user's own line raised: not a library's refusal of the batch
    made = {k: step for k, step in book.values.items() if k in INDEX_COLUMNS and step.dtype in FLOATING}
    if not made:
        return None
    inputs = tuple(TensorMeta(step.dtype or "float32", "cpu", (), "index", k, f"input:{k}") for k, step in made.items())
    line = f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else ""
    message = f"{type(error).__name__}: {first_line(error)}"
    failure = TraceFailure("dtype", message, line, WHERE, None, phase="collate")
    coverage = Coverage((), ("forward",), 0, 0, 0, stopped=f"the batch's collation raised{' at ' + line if line else ''} before calling a model")
    lineage = {k: (step,) for k, step in made.items()}
    return Trace((), (), ModelInfo(WHERE, ()), inputs, lineage=lineage, sources=sources_of(lineage), simulated=simulated,
                 failure=failure, coverage=coverage, values="not measured: the script stopped before calling a model")


def _innermost(error: BaseException) -> Any:
    last = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        last = frame
    return last


def _aten_name(name: str) -> str:
    """The op a torch function or operator stands for: "__matmul__" and "__rmatmul__" → "matmul"."""
    if name.startswith("__r") and hasattr(torch.ops.aten, name[3:].rstrip("_")):
        return name[3:].rstrip("_")
    return name.strip("_")


def _caused_by(error: BaseException, raised: BaseException) -> bool:
    """The script's error is the call's, or was raised while handling it (a re-raise with a message)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if seen is raised:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _user_frame(error: BaseException) -> Any:
    """The innermost frame of the traceback in the user's own files, or None."""
    last = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if is_user_file(frame.f_code.co_filename):
            last = frame
    return last


def _names(frame: Any, tensors: tuple[torch.Tensor, ...]) -> dict[int, str]:
    """id(tensor) → the name the user's frame holds it under (its locals first, then globals)."""
    if frame is None:
        return {}
    wanted = {id(t) for t in tensors}
    names: dict[int, str] = {}
    for scope in (frame.f_locals, frame.f_globals):
        for name, value in list(scope.items()):
            if id(value) in wanted and id(value) not in names and not name.startswith("_"):
                names[id(value)] = name
    return names
