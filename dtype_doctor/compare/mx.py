"""compare's microscaling row: a bfloat16 copy of the user's model whose Linear layers torchao's
MXFP8 training recipe converts (MXFP8TrainingOpConfig), as `quantize_(model, config, filter_fn)` would.

On a machine below compute capability 10.0 (this CPU too) the recipe runs with
KernelPreference.EMULATED: torchao's own casts to float8_e4m3fn blocks of 32 with E8M0 scales, then
a bfloat16 matmul — MXFP8's numbers, not its speed. A Linear whose dimensions are not multiples of
32 is left bfloat16, as a recipe's filter_fn would leave it (torchao asserts on it: DD510). The
weights stay bfloat16 (the recipe quantizes them per matmul), so weight memory is bfloat16's.
"""

from __future__ import annotations

import copy

import torch

from dtype_doctor.records import BLOCK_SIZE


def _convertible(module: torch.nn.Module) -> bool:
    block = BLOCK_SIZE["mxfp8"]
    return type(module) is torch.nn.Linear and module.in_features % block == 0 and module.out_features % block == 0


def mx_copy(model: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, str]:
    """(a bfloat16 copy of `model` with its Linears converted to MXFP8, a note saying how many)."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    model = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    done = sum(_convertible(m) for m in linears)
    if not done:
        raise ValueError("the model has no nn.Linear whose dimensions are multiples of 32, which MXFP8 converts")
    emulated = device.type != "cuda" or torch.cuda.get_device_capability(device) < (10, 0)
    preference = KernelPreference.EMULATED if emulated else KernelPreference.AUTO
    quantize_(model, MXFP8TrainingOpConfig(kernel_preference=preference), filter_fn=lambda m, fqn: _convertible(m))
    left = len(linears) - done
    how = "emulated (MXFP8's numbers, not its speed)" if emulated else "on the GPU's MX kernels"
    return model, (f"{done} Linear layers MXFP8 (torchao, {how})"
                   + (f"; {left} left bfloat16 (a dimension not a multiple of 32)" if left else ""))
