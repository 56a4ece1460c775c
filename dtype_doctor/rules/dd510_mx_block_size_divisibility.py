"""DD510: a Linear converted to a microscaling format (MXFP8/MXFP4: blocks of 32; NVFP4: 16) whose
dimensions are not multiples of the block.

torchao's `to_mx` asserts "the last dimension of shape ... must be divisible by block_size"
(torchao/prototype/mx_formats/mx_tensor.py, `to_mx`; `nvfp4_quantize` in nvfp4_tensor.py for 16):
the forward scales the activation along in_features, the weight along in_features, and the backward
scales the transposed operands, so out_features and the number of tokens in the step too. The CPU
runs the same assertion (the EMULATED kernel preference), so a CPU trace fails as a GPU would.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules._lowbit import converted_calls, failed_in_converted
from dtype_doctor.rules.base import Rule

WORDS = "must be divisible by block_size"


def _bad_dims(in_features: int, out_features: int, tokens: int | None, block: int, train: bool) -> list[str]:
    dims = [("in_features", in_features)]
    if train:  # the weight's gradient scales out_features and the tokens (x.t() @ grad)
        dims += [("out_features", out_features)] + ([("tokens in the step", tokens)] if tokens else [])
    return [f"{name} {n}" for name, n in dims if n % block]


def check(trace: Trace) -> Iterator[Finding]:
    for linear, x in converted_calls(trace):
        tokens = 1
        for d in (x.shape[:-1] if x is not None else ()):
            tokens *= d
        bad = _bad_dims(linear.in_features, linear.out_features, tokens if x is not None else None,
                        linear.block_size, trace.train)
        if not bad:
            continue
        yield RULE.finding(
            f"{linear.recipe.upper()} {linear.module_type} {linear.module}: {', '.join(bad)} not a multiple of the "
            f"{linear.recipe.upper()} block of {linear.block_size} ({'training' if trace.train else 'forward'}): "
            f"torchao's to_mx asserts \"the last dimension ... {WORDS} {linear.block_size}\"",
            module=linear.module,
            module_type=linear.module_type,
            stage="model-code",
            tensors=(x,) if x is not None else (),
            hints=(f"leave {linear.module} out of the conversion (quantize_'s filter_fn / module_filter_fn) or pad its "
                   f"dimensions and the batch's tokens to multiples of {linear.block_size}",),
        )


RULE = Rule(
    code="DD510",
    name="mx-block-size-indivisible",
    severity="error",
    summary="A Linear converted to MXFP8/MXFP4 (blocks of 32) or NVFP4 (blocks of 16) with a dimension not a multiple of the block.",
    why=(
        "Microscaling formats share one scale per block of 32 (OCP MX) or 16 (NVFP4) consecutive elements along the "
        "inner dimension. torchao does not pad: to_mx asserts the last dimension is divisible by the block size. The "
        "backward scales the transposed activation and gradient, so in training out_features and the number of tokens "
        "must divide too (a step of 8 tokens fails in the weight's gradient though the forward passed)."
    ),
    example=(
        "quantize_(model, MXFP8TrainingOpConfig(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear))\n"
        "model(torch.randn(32, 40, dtype=torch.bfloat16))   # nn.Linear(40, 64)\n"
        "AssertionError: the last dimension of shape torch.Size([32, 40]) must be divisible by block_size 32"
    ),
    fix="Leave the layer out of the conversion (filter_fn) or pad its dimensions and the step's tokens to the block size.",
    fix_safety="display-only: which layers to leave out, or how to pad, is the recipe's choice.",
    check=check,
    references=("https://github.com/pytorch/ao/blob/main/torchao/prototype/mx_formats/mx_tensor.py",
                "https://github.com/pytorch/torchtitan/issues/1703"),
    device_note="The same assertion on CPU (EMULATED kernels) and CUDA: a CPU trace fails where a B200 would.",
    explains=lambda trace: failed_in_converted(trace, WORDS),
)
