"""What the low-bit rules share: the converted Linears of a microscaling recipe with the input each
forward call gave it."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import MxLinear, TensorMeta, Trace


def converted_calls(trace: Trace) -> Iterator[tuple[MxLinear, TensorMeta | None]]:
    """Each Linear the recipe converted, with its first forward call's activation (None: not called)."""
    recipe = trace.model.mx_recipe
    if recipe is None:
        return
    first: dict[str, TensorMeta] = {}
    for m in trace.modules:
        if m.phase == "forward" and m.name not in first:
            x = next((t for t in m.inputs if t.is_floating), None)
            if x is not None:
                first[m.name] = x
    for linear in recipe.linears:
        yield linear, first.get(linear.module)


def failed_in_converted(trace: Trace, words: str) -> bool:
    """The step stopped in a converted Linear with torchao's assertion `words` (DD001's failure, explained)."""
    f, recipe = trace.failure, trace.model.mx_recipe
    return (f is not None and recipe is not None and words in f.message
            and (not f.module or any(f.module == lin.module or lin.module.startswith(f.module + ".") or f.module.startswith(lin.module)
                                     for lin in recipe.linears)))
