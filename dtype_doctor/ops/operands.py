"""The dtype an operand must have for its op to accept it: one definition, on plain dtype names.

Rules say it as a finding's remedy, the recorder's repair casts to it to trace on, and the
fix strategies apply the remedy. No torch import: callers pass dtype names.
"""

from __future__ import annotations

from typing import Iterable

from dtype_doctor.records import FLOATING

# Operands that belong to the op's owner (a module's parameters and buffers): the fixed point
# the others must meet, never the one to change.
OWNED_ROLES = ("weight", "bias", "buffer")


def anchor_candidates(operands: Iterable[tuple[str, str | None, bool]], *, inputs_too: bool = True) -> list[str]:
    """The floating dtypes an op could compute in, best first: its weight's, then those of
    operands the model made (not user inputs), then (with `inputs_too`) the inputs'.
    `operands` are (dtype, role, is_input); indices, masks and targets never set it."""
    items = [(d, r, i) for d, r, i in operands if d in FLOATING and r not in ("index", "mask", "target")]
    ranked = [d for d, r, _ in items if r in OWNED_ROLES] + [d for d, r, i in items if r not in OWNED_ROLES and not i]
    if inputs_too:
        ranked += [d for d, r, i in items if r not in OWNED_ROLES and i]
    return list(dict.fromkeys(ranked))


def anchor_dtype(operands: Iterable[tuple[str, str | None, bool]], *, inputs_too: bool = True) -> str | None:
    """The floating dtype the op computes in (the first of anchor_candidates), if any."""
    found = anchor_candidates(operands, inputs_too=inputs_too)
    return found[0] if found else None


def required_dtype(
    role: str | None,
    dtype: str,
    *,
    anchor: str | None,
    class_target: bool = False,
    query: str | None = None,
) -> str:
    """The dtype an operand of `role` must have where the op computes in `anchor`.

    Indices and class-index targets: int64. Value-loss targets: the prediction's dtype.
    Masks: bool, or the query's dtype for an additive (floating) mask. Anything else: the anchor.
    """
    if role == "index":
        return "int64"
    if role == "target":
        if class_target:
            return "int64"
        return anchor or dtype
    if role == "mask":
        return (query or anchor or dtype) if dtype in FLOATING else "bool"
    return anchor or dtype
