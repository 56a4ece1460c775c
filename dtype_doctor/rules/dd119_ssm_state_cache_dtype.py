"""DD119: a state-space model's conv or SSM state cache is written with a tensor of another dtype.

A Mamba-style mixer carries a conv state and an SSM (recurrent) state from step to step. Written
with index_put (`state[idx] = new`), a dtype mismatch raises ("Index put requires the source and
destination dtypes match", sglang#30178): that failure is DD101's. Written with copy_, PyTorch
converts silently: a float32 state stored into a bfloat16 cache is rounded to 8 significant bits
at every step and the rounding is carried along the sequence. This rule names those silent writes.
"""

from __future__ import annotations

import re
from typing import Iterator

from dtype_doctor.records import Finding, OpCall, TensorMeta, Trace
from dtype_doctor.rules._common import base_op, refused
from dtype_doctor.rules.base import Rule

STATE = re.compile(r"(conv|ssm|recurrent)_states?\b")
WRITES = ("aten.copy_", "aten.index_put_", "aten.index_copy_")
# Bits of significand: a write into a dtype with fewer rounds; float16↔bfloat16 loses either way.
BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


def _state(trace: Trace, op: OpCall, mixers: set[str]) -> TensorMeta | None:
    if not op.operands or not op.operands[0].is_floating:
        return None
    dest = op.operands[0]
    if STATE.search(dest.origin or "") or STATE.search(dest.name or ""):
        return dest
    return dest if op.module in mixers and dest.role == "buffer" else None


def _rounds(dest: str, src: str) -> bool:
    return dest != src and not (BITS.get(dest, 0) > BITS.get(src, 0) and {dest, src} != {"float16", "bfloat16"})


def check(trace: Trace) -> Iterator[Finding]:
    mixers = {p.name.rsplit(".", 1)[0] for p in trace.model.parameters if p.name.endswith(".A_log")}
    seen: set[str] = set()
    for op in trace.ops:
        if op.phase != "forward" or base_op(op.op) not in WRITES or refused(op):
            continue
        dest = _state(trace, op, mixers)
        src = next((t for t in op.operands[1:] if t.is_floating), None)
        if dest is None or src is None or not _rounds(dest.dtype, src.dtype):
            continue
        label = (dest.origin or dest.name or "state").split(":", 1)[-1]
        if label in seen:
            continue
        seen.add(label)
        yield RULE.finding(
            f"the state cache {label} is {dest.dtype} and {op.module or 'the model'} writes it a {src.dtype} state "
            f"({base_op(op.op).removeprefix('aten.')}): converted silently, the state is rounded to {dest.dtype} at every "
            f"step and carried along the sequence",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage="forward",
            tensors=(dest, src),
        )


RULE = Rule(
    code="DD119",
    name="ssm-state-cache-dtype",
    severity="warning",
    summary="A state-space model's conv/SSM state cache is written with a state of another dtype (copy_ converts silently).",
    why=(
        "Mamba-style layers carry conv and SSM states between steps. A cache allocated in another dtype than "
        "the model computes in either raises on index_put (DD101: 'Index put requires the source and destination "
        "dtypes match') or, through copy_, rounds the state to the cache's dtype at each step with no error; "
        "over a long sequence the rounding accumulates in the state."
    ),
    example="self.ssm_state = torch.zeros(b, d, n, dtype=torch.bfloat16)  # model runs float32; ssm_state.copy_(h)",
    fix="Allocate the state caches in the dtype the mixer computes its states in (the model's, or float32 for the SSM state).",
    fix_safety="no automatic fix: the cache is allocated by the script or the serving framework.",
    check=check,
)
