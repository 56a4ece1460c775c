"""DD512: a microscaling training recipe the target cannot run as written: a GPU below compute
capability 10.0, or gradients in E5M2.

torchao's MX and NVFP4 kernels take the block-scaled tensor cores of Blackwell: `is_sm_at_least_100()`
guards them (torchao/prototype/mx_formats/kernels.py, mx_tensor.py; NVFP4's `assert is_sm_at_least_100()`
in inference_workflow.py) and the MXFP8 training recipe's KernelPreference.AUTO asks for CUDA/CUTLASS
kernels there; only KernelPreference.EMULATED runs elsewhere. TransformerEngine's MXFP8BlockScaling
uses E4M3 for forward and backward ("pure E5M2 not supported"; the MXFP8 docs: "E4M3 exclusively").
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import MX_CAPABILITY, Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    recipe = trace.model.mx_recipe
    if recipe is None or not recipe.linears:
        return
    first = recipe.linears[0]
    cap = trace.gpu_capability
    if cap is not None and cap < MX_CAPABILITY and not recipe.emulated:
        yield RULE.finding(
            f"{recipe.library} {recipe.recipe.upper()} training on {trace.gpu}: its block-scaled matmuls need compute "
            f"capability 10.0 (Blackwell: B200, GB200); {len(recipe.linears)} converted Linears have no kernel here",
            module=first.module, module_type=first.module_type, stage="model-loading",
            hints=("run on a compute capability 10.x GPU, or fall back to float8 rowwise/tensorwise training on Hopper",),
        )
    if recipe.grad_format == "e5m2":
        yield RULE.finding(
            f"{recipe.library} {recipe.recipe.upper()} recipe with fp8_format E5M2: MXFP8 keeps E4M3 for the gradients "
            "as for the forward (pure E5M2 is not supported)",
            module=first.module, module_type=first.module_type, stage="model-loading",
            hints=("MXFP8BlockScaling(fp8_format=Format.E4M3), the default",),
        )


RULE = Rule(
    code="DD512",
    name="mx-recipe-unsupported-target",
    severity="error",
    summary="A MXFP8/MXFP4/NVFP4 training recipe on a GPU below compute capability 10.0, or with E5M2 gradients.",
    why=(
        "Microscaling matmuls run on Blackwell's block-scaled tensor cores (compute capability 10.0). On an H100 the "
        "recipe's kernels are missing (torchao's is_sm_at_least_100 checks), and a run that seems to work there is the "
        "emulated path, not the recipe. MXFP8 keeps E4M3 for gradients: the per-block scale gives it the range E5M2 "
        "gave per-tensor fp8."
    ),
    example=(
        "dtype-doctor run --simulate --gpu h100 -- python train.py   # quantize_(model, MXFP8TrainingOpConfig())\n"
        "DD512 torchao MXFP8 training on h100 (compute capability 9.0): its block-scaled matmuls need compute capability 10.0"
    ),
    fix="Run on a compute capability 10.x GPU with the recipe's E4M3 format, or use a float8 recipe on Hopper.",
    fix_safety="display-only.",
    check=check,
    references=("https://github.com/pytorch/ao/blob/main/torchao/prototype/mx_formats/kernels.py",
                "https://github.com/NVIDIA/TransformerEngine/blob/main/docs/features/low_precision_training/mxfp8/mxfp8.rst",
                "https://github.com/pytorch/torchtitan/issues/2401"),
    device_note="Judged for the target GPU's compute capability (--gpu); a CPU trace has none and is not judged.",
)
