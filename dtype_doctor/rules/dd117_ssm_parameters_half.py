"""DD117: a state-space mixer's float32 parameters (A_log, D, dt_bias) are held in 16 bits.

Mamba, Mamba-2 and the hybrids (Jamba, Bamba, Falcon-H1, Zamba2, NemotronH, GraniteMoeHybrid) keep
the decay as A_log and compute A = -exp(A_log.float()) in their slow paths: the upcast is there,
but it cannot restore bits a 16-bit A_log no longer holds. Rounding A_log by u·|A_log| (u = 2**-8
for bfloat16, 2**-11 for float16) scales A by up to exp(u·|A_log|): 1.1% (bf16) at A_log = log 16,
the largest initial value of a 16-state Mamba (0.72% measured on one, tests/test_rules_dd117.py).
A state decayed by e**-k over a long context is then off by a factor up to e**(k·that).
"""

from __future__ import annotations

import math
from typing import Iterator

from dtype_doctor.records import Finding, TensorMeta, Trace
from dtype_doctor.rules._common import autocast_remedy, is_half
from dtype_doctor.rules.base import Rule

SSM_PARAMETERS = ("A_log", "D", "dt_bias")
# The unit roundoff: half the gap between neighbouring values, relative to the value.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
# The bound is stated at A_log = log 16: Mamba's largest initial A for its default 16 states.
A_LOG_AT = math.log(16)


def check(trace: Trace) -> Iterator[Finding]:
    params = trace.model.parameters
    mixers = {p.name.rsplit(".", 1)[0] for p in params if p.name.endswith("A_log")}
    held = [p for p in params if "." in p.name and p.name.rsplit(".", 1)[0] in mixers
            and p.name.rsplit(".", 1)[1] in SSM_PARAMETERS and is_half(p.dtype)]
    if not held:
        return
    dtype = held[0].dtype
    first = held[0].name.rsplit(".", 1)[0]
    names = f"{', '.join(p.name for p in held[:4])}{' …' if len(held) > 4 else ''}"
    off = math.exp(UNIT_ROUNDOFF.get(dtype, 2.0**-8) * A_LOG_AT) - 1
    yield RULE.finding(
        f"{len(held)} state-space parameter(s) that expect float32 are {dtype} in {len(mixers)} mixer(s): {names}; "
        f"the decay A = -exp(A_log) is computed from the rounded A_log, off by up to {off:.2%} at A_log = log 16 "
        f"(the slow path's A_log.float() cannot restore the lost bits)",
        module=first,
        module_type=trace.model.module_type(first),
        stage="model-loading",
        tensors=tuple(TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in held[:8]),
        remedies=(autocast_remedy(dtype),),
    )


RULE = Rule(
    code="DD117",
    name="ssm-parameters-half",
    severity="warning",
    summary="A state-space mixer's float32 parameters (A_log, D, dt_bias) are held in bfloat16/float16.",
    why=(
        "Mamba-style mixers store the decay as A_log and compute A = -exp(A_log); mamba_ssm trains them float32 "
        "under autocast. model.to(torch.bfloat16) (or from_pretrained(dtype=...), as transformers declares no "
        "float32 modules for them) rounds A_log by up to 2**-8 of itself, so A is off by up to 1.1% at "
        "A_log = log 16, and a state decayed by e**-k over a long context by a factor e**(0.011·k). The slow "
        "path's A_log.float() upcasts the rounded value; nothing raises."
    ),
    example="model = MambaForCausalLM(config).to(torch.bfloat16)  # A_log, D now bfloat16",
    fix="Keep the model float32 and run the forward under torch.autocast(dtype=torch.bfloat16).",
    fix_safety="autocast changes no stored weight (safe).",
    check=check,
)
