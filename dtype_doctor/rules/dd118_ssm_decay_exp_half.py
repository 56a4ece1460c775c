"""DD118: a state-space mixer computes its decay with exp in bfloat16/float16.

Many Mamba ports write `A = -torch.exp(self.A_log)` and `exp(dt * A)` with no upcast (transformers'
slow paths write `A_log.float()`, so they are not named). In bfloat16 the largest value below 1.0
is 1 - 2**-8: a step's decay exp(dt·A) with |dt·A| under 2**-9 (dt = 0.001, Mamba's time_step_min,
with A = -1) rounds to exactly 1.0, and the state never forgets; larger decays are off by up to
2**-9 of themselves each step, compounding over the sequence. float16's gap below 1.0 is 2**-11.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules._common import autocast_remedy, base_op, is_half
from dtype_doctor.rules.base import Rule

# The largest |x| whose exp(-|x|) rounds to exactly 1.0: half the gap below 1.0.
ROUNDS_TO_ONE = {"bfloat16": 2.0**-9, "float16": 2.0**-12}


def check(trace: Trace) -> Iterator[Finding]:
    mixers = {p.name.rsplit(".", 1)[0] for p in trace.model.parameters if p.name.endswith(".A_log") or p.name == "A_log"}
    seen: set[str] = set()
    for op in trace.ops:
        if op.phase != "forward" or base_op(op.op) not in ("aten.exp", "aten.exp_") or op.module not in mixers or op.module in seen:
            continue
        half = [t for t in op.operands if t.is_floating and is_half(t.dtype)]
        if not half:
            continue
        seen.add(op.module)
        dtype = half[0].dtype
        yield RULE.finding(
            f"{op.module} computes its decay with exp in {dtype}: a step's decay exp(dt·A) with |dt·A| under "
            f"{ROUNDS_TO_ONE.get(dtype, 2.0**-9):.3g} rounds to exactly 1.0 (the state never forgets) and every decay "
            f"is rounded before the scan multiplies it along the sequence",
            module=op.module,
            module_type=op.module_type,
            stage="forward",
            tensors=tuple(half[:2]),
            op=op.op,
            remedies=(autocast_remedy(dtype),),
        )


RULE = Rule(
    code="DD118",
    name="ssm-decay-exp-half",
    severity="warning",
    summary="A state-space mixer computes its decay, exp(A_log) or exp(dt·A), in bfloat16/float16.",
    why=(
        "The scan multiplies each step's decay exp(dt·A) along the sequence. In bfloat16 a decay closer to 1.0 "
        "than 2**-9 rounds to exactly 1.0 (dt = 0.001 with A = -1: the state keeps everything), and any other is "
        "off by up to 2**-9 each step. mamba_ssm and transformers compute A = -exp(A_log.float()) and the scan "
        "in float32; a port that writes torch.exp(self.A_log) on a bf16 model does not. Nothing raises."
    ),
    example="A = -torch.exp(self.A_log)  # A_log bfloat16: exp runs in bfloat16",
    fix="Compute the decay in float32 (torch.exp(self.A_log.float()), dt.float()), or keep the model float32 "
        "under torch.autocast, whose CUDA lists run exp in float32.",
    fix_safety="autocast changes no stored weight (safe).",
    check=check,
)
