"""Where a simulated tensor lives: one rule, which every command asks.

A simulated CUDA tensor is a fake tensor (no data). A build of torch with CUDA fakes CUDA
tensors faithfully; a CPU-only build cannot (its Python bindings build a CUDA device guard that
does not exist, and abort), so there the tensor lives on `meta`, which every build has, and the
report labels it with the CUDA device the step asked for. With several simulated GPUs (a device
map, `--gpus N`) cuda:k lives on meta:k, so fake tensors keep their GPU and meet as CUDA would
meet them ("found at least two devices").
"""

from __future__ import annotations

import torch

STAND_IN = torch.device("meta")  # where a simulated CUDA tensor lives when its GPU index is not kept


def simulated_home(device: torch.device | str | int, *, indexed: bool = False, fakes_cuda: bool = False,
                   loaded: bool = False) -> torch.device:
    """Where a simulated tensor lives that the step puts on `device` (an int: that GPU, as
    accelerate's device maps name them).

    - A model's weights as `scan` loads them (`loaded`): on the CPU, whatever the target. They
      are never the step's: the trace gives each a copy at its home (this rule again), and the
      loader judges flash-attn for a machine that cannot run it.
    - Not CUDA (the CPU): there.
    - CUDA, where the caller's fake mode makes CUDA tensors (`fakes_cuda`: the trace of `scan`
      and the API) and this build of torch has CUDA: there.
    - Else `meta`; `meta:k` for cuda:k with several simulated GPUs (`indexed`).
    """
    if loaded:
        return torch.device("cpu")
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "mps":
        return STAND_IN  # Apple's MPS (--device mps): no build here fakes it; meta, labelled mps:0
    if device.type != "cuda" or (fakes_cuda and torch.version.cuda is not None):
        return device
    return torch.device(STAND_IN.type, device.index or 0) if indexed else STAND_IN
