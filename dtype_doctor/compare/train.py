"""Would one training step work? A real backward + torch.amp.GradScaler step, as an AMP
training loop takes it, on a model the caller lets it change (a copy)."""

from __future__ import annotations

import contextlib
from typing import Any, Mapping

import torch

from dtype_doctor.compare.records import TrainStep
from dtype_doctor.numerics import loss_of

# A scaler that skips a step (inf/NaN gradients) halves its scale and retries, as a training
# loop would on its next batch: from 2**16 down to 1 before the step is called a failure.
TRIES = 17
# trace/cuda_table.py: CUDA's unscale kernel dispatches float and half only.
CUDA_BF16_UNSCALE = (
    "on CUDA this step fails: GradScaler's unscale kernel has no bfloat16 "
    "(\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'); "
    "bfloat16 weights train without a GradScaler"
)
CUDA_FP32_GRADS = "the same on CUDA: the gradients are float32 (bfloat16 needs no GradScaler)"


def error_line(exc: BaseException) -> str:
    """PyTorch's own error as one line: `ValueError: Attempting to unscale FP16 gradients.`"""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def training_loss(out: Any) -> torch.Tensor | None:
    """The model's own loss; without one, the mean of its primary output, reduced as losses are
    (a sum over every element scales the gradients by the batch's size)."""
    return loss_of(out, "mean")


def grad_scaler_step(
    model: torch.nn.Module, inputs: Mapping[str, Any], autocast: str | None, device: torch.device
) -> TrainStep:
    """Backward and GradScaler step on `model` itself (pass a copy); PyTorch's own error if it raises."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return TrainStep(False, "no trainable parameters")
    optimizer = torch.optim.SGD(params, lr=1e-3)
    scaler = torch.amp.GradScaler(device.type)
    skipped = 0
    first_scale = scaler.get_scale()
    try:
        for _ in range(TRIES):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext():
                out = model(**inputs)
            loss = training_loss(out)
            if loss is None or not loss.requires_grad:
                return TrainStep(False, "the output has no loss or floating tensor to backpropagate")
            if not bool(torch.isfinite(loss)):
                return TrainStep(False, f"the loss is {loss.item()}: the step has nothing finite to scale")
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() >= scale:
                break
            skipped += 1
        else:
            return TrainStep(False, f"GradScaler skipped {TRIES} steps: the gradients stay inf/NaN down to scale {scaler.get_scale():g}")
    except Exception as exc:  # noqa: BLE001 - the step failing is the measurement
        return TrainStep(False, "the step raises", error=error_line(exc))
    detail = "one GradScaler step taken" + (
        f" after {skipped} skipped (inf/NaN gradients; scale {first_scale:g} → {scaler.get_scale():g})" if skipped else ""
    )
    return _on_cuda(TrainStep(True, detail), params, autocast, device)


def _on_cuda(step: TrainStep, params: list[torch.Tensor], autocast: str | None, device: torch.device) -> TrainStep:
    """Run elsewhere than CUDA, a bfloat16 row says what CUDA would do with the same step."""
    if device.type == "cuda":
        return step
    if any(p.dtype == torch.bfloat16 for p in params):
        return TrainStep(step.ok, step.detail, step.error, CUDA_BF16_UNSCALE, False)
    if autocast == "bfloat16":
        return TrainStep(step.ok, step.detail, step.error, CUDA_FP32_GRADS, True)
    return step
