"""`dtype-doctor compare`: the user's batch under fp32, autocast fp16/bf16, `.half()`,
`.bfloat16()` and fp16 with the minimal fp32 set, measured side by side.

    import dtype_doctor
    table = dtype_doctor.compare(model, inputs)        # a Comparison
    table.row("half").train_step.error                 # "ValueError: Attempting to unscale FP16 gradients."
    table.recommendation.line                          # "autocast or .half()? autocast bf16: ..."
    table.to_dict()                                    # the JSON (schema_version 1)

Per row: weight and peak memory, forward time, the primary output's error against fp32,
the matmul/conv op that loses most, the modules that overflow, whether one GradScaler
training step works, and a verdict. The stages: records (what is measured, no torch),
measure (memory, time, numerics probes), train (the GradScaler step), engine (the rows),
verdicts, report (rich and JSON).

`dtype_doctor.compare` is both this package and the function: calling it compares.
Importing it does not import torch.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from dtype_doctor.compare.records import Comparison
    from dtype_doctor.pipeline import ScanOptions

__all__ = ["compare", "compare_pipeline"]


def compare(
    model: Any,
    inputs: Mapping[str, Any],
    *,
    variants: Iterable[str] | None = None,
    device: str | None = None,
    repeat: int = 3,
    warmup: int = 1,
    train: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Measure `model(**inputs)` under each variant (default: all six) against fp32.

    `device` None runs where the model is; `repeat` timed runs per row after `warmup`;
    `train` times forward + backward instead of the forward. The model is left as it was.
    """
    from dtype_doctor.compare.engine import REAL_ONLY, run
    from dtype_doctor.compare.records import DEFAULT_ROWS, CompareRequest
    from dtype_doctor.machine.placement import HERE, decide

    where = HERE if device in (None, "auto") else decide(device, real_only=REAL_ONLY)  # HERE: where the model is
    request = CompareRequest(
        variants=tuple(variants) if variants is not None else DEFAULT_ROWS,
        placement=where, repeat=repeat, warmup=warmup, train=train,
    )
    return run(model, inputs, request, progress)


def compare_pipeline(
    model: str,
    dataset: str,
    options: ScanOptions | None = None,
    *,
    variants: Iterable[str] | None = None,
    repeat: int = 3,
    warmup: int = 1,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """`dtype-doctor compare MODEL DATASET`: the batch built exactly as `scan` builds it, compared."""
    from dataclasses import replace

    from dtype_doctor.compare.engine import REAL_ONLY, run
    from dtype_doctor.compare.records import DEFAULT_ROWS, CompareRequest
    from dtype_doctor.pipeline import ScanOptions, memory_named, prepare
    from dtype_doctor.machine.placement import decide
    from dtype_doctor.records import Subject

    options = options or ScanOptions()
    request = CompareRequest(
        variants=tuple(variants) if variants is not None else DEFAULT_ROWS, repeat=repeat, warmup=warmup, train=options.train
    )
    request.validate()  # before the slow part
    options.validated()
    options = options.decided(decide(options.device, real_only=REAL_ONLY))
    with memory_named(options):
        p = prepare(model, dataset, options, progress=progress)
        request = replace(request, placement=replace(options.placement, device=p.device), subject=Subject(model, dataset, p.rows.split))
        return run(p.loaded.model, p.batch.inputs, request, progress)


class _CallablePackage(types.ModuleType):
    """The package `dtype_doctor.compare`, callable as the function of the same name."""

    def __call__(self, model: Any, inputs: Mapping[str, Any], **options: Any) -> Comparison:
        return compare(model, inputs, **options)


sys.modules[__name__].__class__ = _CallablePackage
