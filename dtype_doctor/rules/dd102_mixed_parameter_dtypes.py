"""DD102: the model's floating parameters differ in dtype beyond its declared fp32 modules."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOATING, Finding, TensorMeta, Trace
from dtype_doctor.rules._common import fix_half_model, is_half, keep_fp32, main_dtype
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    main = main_dtype(trace)
    params = [p for p in trace.model.parameters if p.dtype in FLOATING]
    if main is None:
        return
    trainable = [p for p in params if p.requires_grad]
    adapters_mode = 0 < len(trainable) < len(params) / 2
    odd = [
        p
        for p in params
        if p.dtype != main
        and not keep_fp32(trace, p.name)
        # fp32 adapters / heads trained on a frozen half base are the recommended setup.
        and not (adapters_mode and p.requires_grad and p.dtype == "float32" and is_half(main))
    ]
    by_dtype: dict[str, list] = {}
    for p in odd:
        by_dtype.setdefault(p.dtype, []).append(p)
    for dtype, group in by_dtype.items():
        modules = sorted({p.name.rsplit(".", 1)[0] for p in group})
        shown = ", ".join(modules[:4]) + (f" and {len(modules) - 4} more" if len(modules) > 4 else "")
        tensors = [
            TensorMeta(p.dtype, p.device, p.shape, "weight", p.name, f"param:{p.name}") for p in group[:8]
        ]
        fixes = [fix_half_model(main)] if is_half(main) else []
        yield RULE.finding(
            f"{len(group)} parameter(s) are {dtype} in a {main} model: {shown}",
            module=modules[0],
            module_type=trace.model.module_type(modules[0]),
            stage="model-loading",
            tensors=tensors,
            fixes=fixes,
        )


RULE = Rule(
    code="DD102",
    name="mixed-parameter-dtypes",
    severity="warning",
    summary="The model's floating parameters differ in dtype beyond the modules the model declares fp32.",
    why=(
        "A model whose layers hold different dtypes fails wherever activations cross from one dtype to the "
        "other (DD101), and costs memory where it is not needed. Modules listed in _keep_in_fp32_modules and "
        "fp32 adapters on a frozen half base are intentional and not reported."
    ),
    example="model = AutoModel.from_pretrained(p, dtype=torch.float16); model.classifier = nn.Linear(768, 2)  # fp32 head",
    fix="Convert the odd modules to the model's dtype (half-model), or run under autocast so per-op casts bridge them.",
    fix_safety="half-model changes weight precision (unsafe).",
    check=check,
)
