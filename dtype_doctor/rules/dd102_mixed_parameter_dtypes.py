"""DD102: the model's floating parameters differ in dtype beyond its declared fp32 modules."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import FLOATING, Finding, StateTensor, TensorMeta, Trace, main_dtype_of, numel
from dtype_doctor.rules._common import half_model_remedy, is_half, keep_fp32, main_dtype
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    params = [p for p in trace.model.parameters if p.dtype in FLOATING]
    if not trace.model.components:
        yield from _check(trace, params)
        return
    # Several models (a pipeline's components, a teacher and a student): each is judged on its own.
    by_component: dict[str | None, list[StateTensor]] = {}
    for p in params:
        by_component.setdefault(trace.model.component_of(p.name), []).append(p)
    for group in by_component.values():
        yield from _check(trace, group, main_dtype_of((p.dtype, numel(p.shape)) for p in group))


def _check(trace: Trace, params: list[StateTensor], main: str | None = None) -> Iterator[Finding]:
    base = base_dtype(trace, params, main)
    if base is None:
        return
    frozen_half_base = is_half(base) and any(not p.requires_grad for p in params)
    odd = [
        p
        for p in params
        if p.dtype != base
        and not keep_fp32(trace, p.name)
        # fp32 trainables (head, adapters, modules_to_save) on a frozen half base: the recommended setup.
        and not (frozen_half_base and p.requires_grad and p.dtype == "float32")
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
        yield RULE.finding(
            f"{len(group)} parameter(s) are {dtype} in a {base} model: {shown}",
            module=modules[0],
            module_type=trace.model.module_type(modules[0]),
            stage="model-loading",
            tensors=tensors,
            remedies=[half_model_remedy(base, modules[0])] if is_half(base) else [],
        )


def base_dtype(trace: Trace, params: list[StateTensor], main: str | None = None) -> str | None:
    """The dtype the model is meant to be in: its frozen parameters' when some train and some do not.

    Trainable heads and adapters can outweigh a tiny frozen backbone, so counting every
    element would call an fp32 head "the model" and blame the half backbone.
    """
    frozen = [p for p in params if not p.requires_grad and not keep_fp32(trace, p.name)]
    if frozen and len(frozen) < len(params):
        return main_dtype_of((p.dtype, numel(p.shape)) for p in frozen)
    return main or main_dtype(trace)


RULE = Rule(
    code="DD102",
    name="mixed-parameter-dtypes",
    severity="warning",
    summary="The model's floating parameters differ in dtype beyond the modules the model declares fp32.",
    why=(
        "A model whose layers hold different dtypes fails wherever activations cross from one dtype to the "
        "other (DD101), and costs memory where it is not needed. Modules listed in _keep_in_fp32_modules and "
        "fp32 trainable heads, adapters and modules_to_save on a frozen half base are intentional and not reported."
    ),
    example="model = AutoModel.from_pretrained(p, dtype=torch.float16); model.classifier = nn.Linear(768, 2)  # fp32 head",
    fix="Convert the odd modules to the model's dtype (half-model), or run under autocast so per-op casts bridge them.",
    fix_safety="half-model changes weight precision (unsafe).",
    check=check,
)
