"""The doctor's TorchFunctionModes on the script's mode stack, removed without touching the script's.

`TorchFunctionMode.__exit__` pops whatever is on top. While the user's script runs, the top
may be the script's own mode (`with torch.device("meta"):`, `torch.set_default_device`), so
the doctor's modes are taken out by identity, wherever they are, and the modes above them
are put back in their order.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack, _pop_mode, _push_mode


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
