"""DD103: an index tensor (ids, gather/embedding indices) has a dtype the op rejects."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, OpCall, TensorMeta, Trace
from dtype_doctor.records.tensors import FLOATING
from dtype_doctor.ops.operands import required_dtype
from dtype_doctor.rules._common import base_op, cast_remedies, describe, refused, source_of, stage_of
from dtype_doctor.rules.base import Rule

# What each op accepts for its index operand. Whether an op was refused is the kernel's call
# (a real trace, or the simulated trace's probe); these sets only say that the index is the
# operand it refused, so DD103 rather than DD100 explains it. Measured on torch 2.13's kernels.
ACCEPTED = {
    "aten.index_add": {"int64", "int32"},
    "aten.index_reduce": {"int64", "int32"},
    "aten.index_copy": {"int64"},
    "aten.index_fill": {"int64"},
    "aten.scatter": {"int64", "int32"},
    "aten.scatter_add": {"int64", "int32"},
    "aten.scatter_reduce": {"int64", "int32"},
    "aten.put": {"int64"},
    "aten.take": {"int64"},
    "aten.embedding": {"int64", "int32"},
    "aten.embedding_bag": {"int64", "int32"},
    "aten._embedding_bag": {"int64", "int32"},
    "aten.index_select": {"int64", "int32"},
    "aten.gather": {"int64", "int32"},
    "aten.take_along_dim": {"int64"},  # "dtype of indices should be Long"
    "torch.take_along_dim": {"int64"},  # checked before dispatch, so watched as a function
    "aten.index": {"int64", "int32", "bool", "uint8"},
}


def rejected_indices(op: OpCall) -> list[TensorMeta]:
    accepted = ACCEPTED.get(base_op(op.op))
    if accepted is None:
        return []
    return [t for t in op.by_role("index") if t.dtype not in accepted]


# The batch columns a model looks up as indices (embeddings): never floating.
INDEX_COLUMNS = ("input_ids", "token_type_ids", "position_ids", "decoder_input_ids")


def check(trace: Trace) -> Iterator[Finding]:
    yield from _refused_in_collation(trace)
    seen: set[tuple] = set()
    for op in trace.ops:
        if op.phase != "forward" or not refused(op):
            continue
        accepted = ACCEPTED.get(base_op(op.op), set())
        for t in rejected_indices(op):
            key = (op.module, base_op(op.op), t.dtype)
            if key in seen:
                continue
            seen.add(key)
            wrong = lambda d: d not in accepted  # noqa: E731 - where the ids first became unusable
            yield RULE.finding(
                f"{op.module_type or base_op(op.op)} got {t.dtype} indices ({describe(t)}); it accepts {' or '.join(sorted(accepted))}",
                module=op.module,
                module_type=op.module_type,
                op=op.op,
                stage=stage_of(trace, t, rejected=wrong),
                tensors=(t,),
                source=source_of(trace, t),
                pytorch_error=op.error,
                remedies=cast_remedies(trace, (t,), required_dtype("index", t.dtype, anchor=None), wrong),
            )


RULE = Rule(
    code="DD103",
    name="index-dtype",
    severity="error",
    summary="An index tensor (input_ids, position ids, gather/embedding indices) is floating or otherwise rejected.",
    why=(
        "Embedding lookups and gathers take integer indices. Token ids that went through a float cast "
        "(a numpy float array, a collator that stacked them with floats, .half() on the whole batch) fail "
        "at the first embedding."
    ),
    example=(
        "batch = {k: v.half() for k, v in batch.items()}\n"
        "model(**batch)\n"
        "RuntimeError: Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int"
    ),
    fix="Cast only floating inputs to the model dtype; cast ids and other indices to int64 (cast-inputs).",
    fix_safety="cast-inputs is safe.",
    check=check,
    rejects=lambda op: bool(rejected_indices(op)),
)


def _refused_in_collation(trace: Trace) -> Iterator[Finding]:
    """Token ids the user's map function made floating, refused where the batch is collated (a
    tokenizer's `pad` raises on floats) before any model ran: the trace's inputs are those columns."""
    failure = trace.failure
    if failure is None or failure.phase != "collate":
        return
    for t in trace.inputs:
        if t.role == "index" and t.is_floating:
            yield RULE.finding(
                f"{t.name} made of {t.dtype} values: token ids must be integers, and the batch's collation refused them",
                module_type=failure.module_type,
                stage=stage_of(trace, t, rejected=lambda d: d in FLOATING),
                tensors=(t,),
                source=source_of(trace, t),
                pytorch_error=failure.message,
                remedies=cast_remedies(trace, (t,), "int64", lambda d: d in FLOATING),
            )
