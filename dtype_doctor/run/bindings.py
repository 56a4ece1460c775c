"""At the traced model call: the user's lines that last bound the model and each of its inputs.

The lineage sees tensors through torch's ops; a batch the script forgot to move, or a model it
never moved, has no op on the line that lost the move. The call's own frame holds the names
(`output = model(data)`), so source.bindings can name where each was last bound, following a
name that is a parameter of the user's function to the caller's argument (`train(model, ...)` →
`model = Net()` in `main`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from dtype_doctor.machine.user_code import display_path, first_user_frame, frames_above, is_user_file
from dtype_doctor.records import SourceLoc
from dtype_doctor.source.bindings import FORWARD_ENTRIES, assigned_at, autocast_entered, call_at, last_binding, parameter_index, unpacked_from

_DEPTH = 3  # callers followed for a name that is a parameter


@dataclass(frozen=True)
class CallBindings:
    """The model call's line, the line that last bound the called model's name, and each input's
    (by the forward's parameter name)."""

    call: SourceLoc | None = None
    model: SourceLoc | None = None
    inputs: dict[str, SourceLoc] = field(default_factory=dict)
    autocast: SourceLoc | None = None  # the line that made the autocast a `with` around the call entered
    # The name the call's line calls the model by (`encoder(x)`, `vae.encode(x)`): a local of the calling
    # frame that is the model or holds it, and is called on that line. None when not exactly one.
    model_name: str | None = None


def bound_at_call(model: Any, args: tuple, kwargs: dict) -> CallBindings:
    """Where the user's code bound what it passed to `model(*args, **kwargs)`; empty when the model
    is called from a library (the Trainer) or the call is not a plain name's. Never raises: naming
    a line must not break the script."""
    try:
        return _bound_at_call(model, args, kwargs)
    except Exception:  # noqa: BLE001
        return CallBindings()


def _bound_at_call(model: Any, args: tuple, kwargs: dict) -> CallBindings:
    frame = first_user_frame(frames_above(2))
    if frame is None:
        return CallBindings()
    file = frame.f_code.co_filename
    site = call_at(file, frame.f_lineno)
    if site is None or site.callee is None:
        return CallBindings()
    try:
        names = [p for p in inspect.signature(model.forward).parameters]
    except (TypeError, ValueError):
        names = []
    passed = {names[i]: arg for i, arg in enumerate(site.positional[:len(args)]) if i < len(names) and arg}
    passed.update({k: v for k, v in site.keywords if v and k in kwargs})
    if site.unpacked:  # `model(**batch)`: each keyword the call did not name came out of `batch`
        passed.update({k: site.unpacked for k in kwargs if k not in passed})
    inputs = {param: loc for param, arg in passed.items() if (loc := _bound(frame, arg, _DEPTH)) is not None}
    callee = _bound(frame, site.callee, _DEPTH) if "." not in site.callee else None
    made = autocast_entered(file, frame.f_lineno)
    autocast = SourceLoc(display_path(file), made) if made is not None else None
    return CallBindings(SourceLoc(display_path(file), frame.f_lineno), callee, inputs, autocast, _called_as(frame, model))


_CALLS = ("(", *(f".{m}(" for m in sorted(FORWARD_ENTRIES)))  # how a line calls a model


def _called_as(frame: FrameType, model: Any) -> str | None:
    """The one local of `frame` holding `model` that its line calls (`encoder(`, `vae.encode(`)."""
    import linecache
    import re

    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    held = [name for name, value in frame.f_locals.items() if _holds(value, model)]
    called = [n for n in held if any(re.search(rf"(?<![\w.]){re.escape(n)}{re.escape(e)}", text) for e in _CALLS)]
    return called[0] if len(called) == 1 else None


def _holds(value: Any, model: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module) and (value is model or any(m is model for m in value.modules()))


def _bound(frame: FrameType, name: str, depth: int) -> SourceLoc | None:
    file, line = frame.f_code.co_filename, frame.f_lineno
    found = last_binding(file, line, name)
    if found is not None:
        return SourceLoc(display_path(file), _unpacked(file, found, name))
    param = parameter_index(file, line, name)
    parent = frame.f_back
    if param is None or depth == 0 or parent is None or not is_user_file(parent.f_code.co_filename):
        return None
    function, index = param
    site = call_at(parent.f_code.co_filename, parent.f_lineno, callee=function)
    if site is None:
        return None
    if index is not None and site.callee and "." in site.callee and frame.f_code.co_varnames[:1] in (("self",), ("cls",)):
        index -= 1  # a method called on its object: `self` is not among the call's arguments
    arg = site.positional[index] if index is not None and 0 <= index < len(site.positional) else dict(site.keywords).get(name)
    return _bound(parent, arg, depth - 1) if arg else None


def _unpacked(file: str, line: int, name: str) -> int:
    """`x, y = batch` names no move; the assignment that made `batch` (`batch = [t for t in batch]`,
    where the `.to(device)` was dropped) does. Followed through plain names while each is assigned."""
    for _ in range(_DEPTH):
        source = unpacked_from(file, line, name)
        earlier = last_binding(file, line, source) if source else None
        if earlier is None or not assigned_at(file, earlier):
            return line
        line, name = earlier, source
    return line


def dtype_decided_at(site: SourceLoc | None, dtype: str) -> SourceLoc | None:
    """A load that takes its dtype by a name (`from_pretrained(..., dtype=load_dtype)`): the assignment
    that chose it (`load_dtype = torch.float16 if ... else torch.float32`), where `dtype` was decided;
    else `site` as it is. An assignment that does not name `dtype` (the other branch of an if/else, bound
    last in the file but not what ran) is not taken. Never raises."""
    if site is None:
        return None
    try:
        call = call_at(site.file, site.line)
        name = next((v for k, v in call.keywords if k in ("dtype", "torch_dtype") and v), None) if call else None
        made = last_binding(site.file, site.line, name) if name else None
        if made is None or not assigned_at(site.file, made):
            return site
        import linecache

        return SourceLoc(site.file, made) if dtype in linecache.getline(site.file, made) else site
    except Exception:  # noqa: BLE001 - naming a line must not break the report
        return site
