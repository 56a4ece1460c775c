"""What the value rules (DD301-DD303) share: the trace's compute precision and value wording."""

from __future__ import annotations

import math

from dtype_doctor.records import OpCall, Remedy, Trace, ValueStats, merge_stats as merge
from dtype_doctor.rules._common import main_dtype

# A forecast flags values within this factor of float16's max: the traced rows are a sample
# of a few; other rows, longer inputs and further training make activations larger, and an
# fp16 forward rounds its partial sums, so a value at half the limit in fp32 is one
# unlucky batch away from inf.
FORECAST_MARGIN = 2.0


def computes_in_fp16(trace: Trace) -> bool:
    """The traced step computes in float16: an fp16 model, or fp16 autocast."""
    return trace.autocast == "float16" or (trace.autocast is None and main_dtype(trace) == "float16")


def overflowed(op: OpCall) -> bool:
    """A float16 op that turned finite operands into inf: fp16's range was exceeded right here."""
    s, o = op.stats, op.operand_stats
    if s is None or op.phase != "forward" or not op.outputs or op.outputs[0].dtype != "float16":
        return False
    return math.isinf(s.absmax) and o is not None and o.finite  # a constant fill has no floating operands


def module_outputs(trace: Trace) -> dict[str, ValueStats]:
    """Each module's outputs over all its forward calls, merged."""
    seen: dict[str, list[ValueStats]] = {}
    for m in trace.modules:
        if m.phase == "forward" and m.stats is not None:
            seen.setdefault(m.name, []).append(m.stats)
    return {name: s for name, stats in seen.items() if (s := merge(stats)) is not None}


def escapes(op: OpCall, outputs: dict[str, ValueStats], threshold: float) -> bool:
    """The op's large value reaches its module's output (as a large or non-finite value).

    An intermediate that the module itself absorbs is no risk: GELU's tanh form cubes its
    input (783³ = 4.8e8 is inf in fp16) and tanh(inf) = 1 gives the right answer.
    """
    out = outputs.get(op.module)
    return out is None or not out.finite or out.absmax >= threshold


def value(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.4g}")


def span(s: ValueStats | None) -> str:
    return "no floating inputs" if s is None else f"|x| ≤ {value(s.absmax)}"


def keep_fp32_remedy(module: str) -> Remedy:
    return Remedy("keep-fp32", module or "model", "float32", "model-loading")
