"""Tensor subclasses of a library (torchao's float8 tensors) that wrap plain tensors and run their
own ops on them: the recorder records those inner ops, value statistics measure the plain tensors.
torch's own wrappers (DTensor, functional tensors) and FakeTensor keep their handling."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type


def library_wrapper(cls: type) -> bool:
    """Whether `cls` is a traceable wrapper subclass defined outside torch."""
    return (
        cls is not torch.Tensor
        and cls is not torch.nn.Parameter
        and not cls.__module__.startswith("torch.")
        and is_traceable_wrapper_subclass_type(cls)
    )


def wrapper_type(types: Any) -> type | None:
    """The first of an op's operand types (a dispatch handler's `types`: empty for plain tensors)
    that is a library wrapper. Every recorded op asks: the answer per type is kept."""
    for t in types:
        known = _WRAPPERS.get(t)
        if known is None:
            known = _WRAPPERS[t] = library_wrapper(t)
        if known:
            return t
    return None


_WRAPPERS: dict[type, bool] = {}
