"""The doctor's TorchFunctionModes on the script's mode stack, removed without touching the script's.

`TorchFunctionMode.__exit__` pops whatever is on top. While the user's script runs, the top
may be the script's own mode (`with torch.device("meta"):`, `torch.set_default_device`), so
the doctor's modes are taken out by identity, wherever they are, and the modes above them
are put back in their order. `modes_aside` sets the doctor's modes aside for a block (a model's
repeated call that runs unwatched) and puts them back where they were.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack, _pop_mode, _push_mode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack


def push_function_mode(mode: TorchFunctionMode) -> None:
    _push_mode(mode)


def remove_function_mode(mode: TorchFunctionMode) -> bool:
    """Take `mode` off the stack; the modes pushed after it stay, in their order."""
    if not any(m is mode for m in _get_current_function_mode_stack()):
        return False
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_mode(m)
    return True


def tensors_in(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a torch function was called with: positional, keyword, and inside lists/tuples."""
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


@contextlib.contextmanager
def modes_aside(function_modes: Iterable[TorchFunctionMode], dispatch_mode: TorchDispatchMode | None = None) -> Iterator[None]:
    """The block runs without the doctor's modes: `function_modes` and `dispatch_mode` are taken off their
    stacks by identity and put back where they were, the script's own modes untouched. Nothing else is
    switched off: a tensor subclass's own `__torch_function__`/`__torch_dispatch__` run as in the plain
    script (torch's DisableTorchFunction/_DisableTorchDispatch would turn those off too). A dispatch mode
    the script pushed above the doctor's keeps the doctor's on (a dispatch mode's exit pops the top)."""
    ours = list(function_modes)
    before = _get_current_function_mode_stack()
    taken = [m for m in ours if remove_function_mode(m)]
    without = _get_current_function_mode_stack()
    dispatch_off = dispatch_mode is not None and _on_top(dispatch_mode)
    if dispatch_off:
        dispatch_mode.__exit__(None, None, None)  # its own exit: torch's in-mode flags go back with it
    try:
        yield
    finally:
        if dispatch_off:
            dispatch_mode.__enter__()
        if taken:
            _put_back(before, without, taken)


def _on_top(mode: TorchDispatchMode) -> bool:
    stack = _get_current_dispatch_mode_stack()
    return bool(stack) and stack[-1] is mode


def _put_back(before: list, without: list, taken: list) -> None:
    """The function mode stack as `before`, plus what the block left pushed on top of `without` (the
    stack it ran with); where the block popped the script's own modes, the doctor's go on top."""
    now = _get_current_function_mode_stack()
    if len(now) < len(without) or any(a is not b for a, b in zip(now, without)):
        for m in taken:
            _push_mode(m)
        return
    for _ in now:
        _pop_mode()
    for m in (*before, *now[len(without):]):
        _push_mode(m)
