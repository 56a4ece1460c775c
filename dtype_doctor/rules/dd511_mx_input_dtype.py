"""DD511: a Linear converted to a microscaling format fed an activation torchao cannot scale (float16).

torchao's `to_mx` and `nvfp4_quantize` assert `data_hp.dtype in (torch.bfloat16, torch.float)`
("torch.float16 is not supported yet", torchao/prototype/mx_formats/mx_tensor.py and
nvfp4_tensor.py); the Blackwell recipes are bf16 recipes (float32 runs, at twice the traffic).
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules._lowbit import converted_calls, failed_in_converted
from dtype_doctor.rules.base import Rule

TAKEN = ("bfloat16", "float32")


def check(trace: Trace) -> Iterator[Finding]:
    seen: set[str] = set()
    for linear, x in converted_calls(trace):
        if x is None or x.dtype in TAKEN or x.dtype in seen:
            continue
        seen.add(x.dtype)
        yield RULE.finding(
            f"{linear.recipe.upper()} {linear.module_type} {linear.module} takes a {x.dtype} activation: torchao scales "
            f"only bfloat16 (or float32) into {linear.recipe.upper()} (\"torch.{x.dtype} is not supported yet\")",
            module=linear.module,
            module_type=linear.module_type,
            tensors=(x,),
            hints=("train in bfloat16 (model.to(torch.bfloat16) or autocast(dtype=torch.bfloat16)), not float16",),
        )


RULE = Rule(
    code="DD511",
    name="mx-input-not-bfloat16",
    severity="error",
    summary="A Linear converted to MXFP8/MXFP4/NVFP4 fed a float16 activation: torchao's MX casts take bfloat16 (or float32) only.",
    why=(
        "The microscaling casts compute each block's shared exponent from a bfloat16 or float32 tensor; torchao asserts "
        "the dtype before scaling. A float16 model, or float16 autocast, stops at the first converted Linear."
    ),
    example=(
        "model = nn.Linear(64, 64).half(); quantize_(model, MXFP8TrainingOpConfig())\n"
        "model(torch.randn(32, 64, dtype=torch.float16))\n"
        "AssertionError: torch.float16 is not supported yet"
    ),
    fix="Train in bfloat16: the MX and NVFP4 recipes are bfloat16 recipes.",
    fix_safety="display-only.",
    check=check,
    references=("https://github.com/pytorch/ao/blob/main/torchao/prototype/mx_formats/mx_tensor.py",),
    device_note="The same assertion on CPU and CUDA.",
    explains=lambda trace: failed_in_converted(trace, "is not supported yet"),
)
