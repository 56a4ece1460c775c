"""DD105: a float64 tensor reaches the model or the loss."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules._common import (
    LOSSES,
    base_op,
    cast_remedies,
    consumer,
    main_dtype,
    required_of,
    source_of,
    stage_of,
)
from dtype_doctor.rules.base import Rule


def is_float64(dtype: str) -> bool:
    return dtype == "float64"


def check(trace: Trace) -> Iterator[Finding]:
    target = main_dtype(trace) or "float32"
    if target == "float64":
        return  # a float64 model is meant to compute in float64
    reported: set[str] = set()
    for t in trace.inputs:
        if t.dtype == "float64" and t.name not in reported:
            reported.add(t.name or "")
            # What the input must be is what its consumer needs: float64 input_ids are indices
            # (int64, as DD103 says), float64 labels of a class loss int64, data the model's dtype.
            use = consumer(trace, t.name or "")
            wanted = required_of(use[0], use[1], target) if use else target
            used_as = f"; it is used as {_ROLE_WORDS[use[1].role]}, which must be {wanted}" if use and wanted != target else ""
            yield RULE.finding(
                f"model input {t.name} is float64; the model computes in {target}{used_as}",
                tensors=(t,),
                stage=stage_of(trace, t, rejected=is_float64),
                source=source_of(trace, t),
                remedies=cast_remedies(trace, (t,), wanted, is_float64),
            )
    for op in trace.ops:
        if op.phase != "forward" or base_op(op.op) not in LOSSES:
            continue
        for t in op.operands:
            name = t.name or t.origin or ""
            if t.dtype == "float64" and name not in reported:
                reported.add(name)
                wanted = required_of(op, t, target)
                yield RULE.finding(
                    f"float64 {t.role} reaches {base_op(op.op).removeprefix('aten.')}",
                    module=op.module,
                    module_type=op.module_type,
                    op=op.op,
                    stage=stage_of(trace, t, rejected=is_float64),
                    tensors=(t,),
                    source=source_of(trace, t),
                    remedies=cast_remedies(trace, (t,), wanted, is_float64),
                )


_ROLE_WORDS = {"index": "indices", "target": "a loss target", "mask": "a mask"}


RULE = Rule(
    code="DD105",
    name="float64-in-pipeline",
    severity="warning",
    summary="A float64 tensor reaches the model or the loss.",
    why=(
        "numpy and pandas default to float64; torch.from_numpy keeps it. A float64 input fails in any fp32 "
        "layer (DD101), and a float64 target makes the loss and its gradient run in double precision, slowly, "
        "or fails in backward."
    ),
    example="features = torch.from_numpy(df.values)  # float64\nmodel(input_values=features)\nRuntimeError: Found dtype Double but expected Float",
    fix=(
        "Cast where the array becomes a tensor, to what its consumer needs: the model's dtype for data, int64 for "
        "ids and class labels, the prediction's dtype for regression targets (cast-inputs)."
    ),
    fix_safety="cast-inputs is safe.",
    check=check,
)
