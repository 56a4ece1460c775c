"""DD114: a TF32 switch set through one of PyTorch's two APIs and read through the other.

PyTorch 2.9 added `fp32_precision` (`torch.backends.cuda.matmul.fp32_precision`,
`torch.backends.cudnn.conv.fp32_precision`, `torch.backends.fp32_precision`) beside the legacy
`allow_tf32` and `torch.set_float32_matmul_precision`. Once the new API set a switch, a read of it
through the legacy one raises RuntimeError ("... you have used mix of the legacy and new APIs ...",
aten/src/ATen/Context.cpp), on a CPU build too: the check is on the flags, not the device. The
setter is often the script and the reader a library (Lightning, inductor). The rule reports the
reads PyTorch refused (error), and a state PyTorch would refuse to read that nothing has read yet
(warning): PyTorch decides, through the watch of machine/precision_state.py.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, PrecisionState, Remedy, Setter, Tf32Mix, Trace
from dtype_doctor.records.precision import LEGACY, NEW, UNREADABLE
from dtype_doctor.rules.base import Rule

STRATEGY = "tf32-new-api"  # fix.strategies.tf32_new_api: the script's TF32 lines moved to the new API


def _line(setter: Setter) -> object:
    """The user's line a finding points at: the script's own, else the script's call into the library."""
    return setter.source if setter.by == "script" else setter.via


def _refused(mix: Tf32Mix) -> Finding:
    remedies = []
    hints: list[str] = []
    if mix.setter.by == "script" and mix.set_api == LEGACY:
        remedies.append(Remedy(STRATEGY, mix.set_name, NEW, "launch", mix.setter.source))
    if mix.reader.by == "script" and mix.set_api == NEW:
        remedies.append(Remedy(STRATEGY, mix.read_name, NEW, "launch", mix.reader.source))
    if mix.reader.by == "library" and mix.set_api == NEW:
        hints.append(f"{mix.reader.library} reads the legacy {mix.read_name}: upgrade it to a release that reads "
                     "fp32_precision, or set TF32 through the legacy API alone until then")
    message = (f"{mix.read_name} was read by {mix.reader.words()} after {mix.set_name} (the {mix.set_api} API) was set by "
               f"{mix.setter.words()}: PyTorch refuses to read a TF32 switch through one API once the other set it, "
               "and raises RuntimeError. Use one API for every TF32 switch; PyTorch recommends fp32_precision.")
    source = remedies[0].source if remedies else _line(mix.setter) or _line(mix.reader)  # the line to change
    return RULE.finding(message, stage="launch", source=source,  # type: ignore[arg-type]
                        pytorch_error=f"RuntimeError: {mix.error}", remedies=remedies, hints=hints)


def _latent(state: PrecisionState) -> Iterator[Finding]:
    """Switches PyTorch would refuse to read, set through both APIs, that nothing has read yet."""
    for family in ("matmul", "cudnn"):
        mixed = [s for s in state.switches if s.value == UNREADABLE and family in s.name]
        set_ = [s for s in state.switches if s.changed and (family in s.name or s.name == "torch.backends.fp32_precision")]
        legacy = [s for s in set_ if s.api == LEGACY]
        new = [s for s in set_ if s.api == NEW]
        if not mixed or not legacy or not new:
            continue
        remedies = [Remedy(STRATEGY, s.name, NEW, "launch", s.setter.source) for s in legacy if s.setter.by == "script"]
        yield RULE.finding(
            f"{mixed[0].name} cannot be read: {legacy[0].name} (legacy) was set by {legacy[0].setter.words()} and "
            f"{new[0].name} (new) by {new[0].setter.words()}. Nothing read it in the traced step; the first read "
            "(a library checking TF32, torch.compile's inductor) raises RuntimeError.",
            severity="warning", stage="launch", source=_line(legacy[0].setter) or _line(new[0].setter),  # type: ignore[arg-type]
            remedies=remedies)


def check(trace: Trace) -> Iterator[Finding]:
    state = trace.precision
    if state is None:
        return
    seen: set[tuple] = set()
    for mix in state.mixes:
        key = (mix.set_name, mix.read_name, mix.reader.source)
        if key not in seen:
            seen.add(key)
            yield _refused(mix)
    if not state.mixes:
        yield from _latent(state)


def explains(trace: Trace) -> bool:
    """The step stopped on a TF32 read PyTorch refused: this rule's to report, not DD001's."""
    return trace.failure is not None and trace.precision is not None and any(
        m.error.split(",")[0] in trace.failure.message for m in trace.precision.mixes)


RULE = Rule(
    code="DD114",
    name="mixed-tf32-apis",
    severity="error",
    summary="A TF32 switch is set through one of PyTorch's two APIs (allow_tf32 / fp32_precision) and read through the other, which raises.",
    why=(
        "PyTorch 2.9 split the TF32 switches into a new API (fp32_precision) beside the legacy allow_tf32 and "
        "set_float32_matmul_precision. Once the new API set a switch, reading it through the legacy one raises "
        "RuntimeError ('you have used mix of the legacy and new APIs'), on every device: the script that set it "
        "runs on, and the library that reads it (Lightning, torch.compile's inductor) stops the run."
    ),
    example="torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
            "torch.backends.cuda.matmul.allow_tf32  # RuntimeError: ... mix of the legacy and new APIs ...",
    fix="Set every TF32 switch through one API: PyTorch recommends the new one (torch.backends.cuda.matmul.fp32_precision = "
        "'tf32', torch.backends.cudnn.conv.fp32_precision = 'tf32').",
    fix_safety="safe: tf32-new-api rewrites the script's legacy TF32 lines (allow_tf32 = X, set_float32_matmul_precision) "
               "into the fp32_precision lines that set the same switches; a library's read is display-only.",
    check=check,
    explains=explains,
    references=("https://github.com/pytorch/pytorch/pull/194680", "https://github.com/pytorch/pytorch/issues/179445",
                "https://github.com/pytorch/pytorch/issues/166387",
                "https://pytorch.org/docs/main/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"),
    device_note="The same on every device: PyTorch checks the flags when they are read, before any kernel (a CPU build raises too).",
)
