"""What the trace needs to know of an op, worked out once per op: an op's schema never changes.

`facts(func)` is the one place these are read from an aten op (or a watched torch function's
`_FunctionSchema`): its printed name, the role of each argument, what the value statistics do
with its result, and which arguments it writes. The recorder and the write guard look an op up
once per call (an OpOverload hashes in Python, so each extra table cost every op a call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# Schema argument name → operand role.
ARG_ROLES = {
    "weight": "weight",
    "bias": "bias",
    "indices": "index",
    "index": "index",
    "target": "target",
    "attn_mask": "mask",
    "mask": "mask",
    "running_mean": "buffer",
    "running_var": "buffer",
}
# Ops whose "weight" argument is not a layer weight (class weights of a loss).
_LOSS_OPS = ("nll_loss", "binary_cross_entropy", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div")
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
# Ops whose result only selects or shrinks their tensor operands: |y| ≤ max |x|, and finite
# operands give a finite result. Their exact extremes are bounded by the operands'.
BOUNDED = frozenset(
    {"relu", "relu_", "gelu", "silu", "silu_", "tanh", "abs", "neg", "where.self",
     "max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool1d", "max_pool2d", "adaptive_max_pool2d"}
)


@dataclass(frozen=True, slots=True)
class OpFacts:
    name: str  # "aten.add.Tensor": str() of an OpOverload is Python work
    roles: tuple[str | None, ...]  # the role of each positional argument
    names: frozenset[str] | None  # the schema's argument names; None: no schema, a keyword's role is its name's
    measured: bool  # its result is measured: not a view (its operand's values), nor empty (whatever memory held)
    bounded: bool  # its result is bounded by its operands (BOUNDED)
    mutates: bool  # it writes into an operand (add_, copy_, `out=`; `t[...] = v` writes through index_put_ or fill_)
    out_args: tuple[str, ...]  # its write-only `out=` arguments, whose old values it never reads
    written: tuple[int, ...]  # the indices of the arguments it writes (the write guard saves those)
    is_view: bool


_FACTS: dict[Any, OpFacts] = {}


def facts(func: Any) -> OpFacts:
    found = _FACTS.get(func)
    if found is None:
        found = _FACTS[func] = _worked_out(func)
    return found


def _worked_out(func: Any) -> OpFacts:
    schema = getattr(func, "_schema", None)
    arguments = tuple(getattr(schema, "arguments", ()))
    names = [a.name for a in arguments]
    is_loss = any(k in str(func) for k in _LOSS_OPS)
    name = getattr(func, "__name__", "")
    base = name if name == "where.self" else name.split(".")[0]  # where with a Python number is not bounded
    is_view = bool(getattr(func, "is_view", False))
    return OpFacts(
        name=str(func),
        roles=tuple(None if (is_loss and n == "weight") else ARG_ROLES.get(n) for n in names),
        names=frozenset(names) if schema is not None else None,
        measured=not (is_view or base in _UNINITIALISED),
        bounded=base in BOUNDED,
        mutates=bool(getattr(schema, "is_mutable", False)),
        out_args=tuple(a.name for a in arguments if getattr(a, "is_out", False)),
        written=tuple(
            i for i, a in enumerate(arguments) if getattr(a, "alias_info", None) is not None and a.alias_info.is_write
        ),
        is_view=is_view,
    )
