"""Measure every row of the table: build the row's model, probe its numerics against the fp32
run, then its peak memory, its time and one GradScaler training step.

The user's model is never changed: autocast rows run it as it is (an fp32 model on the
device) under torch.autocast, with the training flags, gradients and buffers restored; rows
that convert weights work on copies.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import torch

from dtype_doctor.compare.measure import Numerics, peak_method, probe, run_peak, run_times, tensor_bytes, worst
from dtype_doctor.compare.records import REFERENCE, CompareRequest, Comparison, OutputError, Row, Variant
from dtype_doctor.compare.train import error_line, grad_scaler_step, training_loss
from dtype_doctor.compare.verdicts import recommend, verdict
from dtype_doctor.records.errors import InputError, is_out_of_memory
from dtype_doctor.numerics import forward, fp32_inputs, fp32_reference, output_diff, weight_bytes
from dtype_doctor.records import Subject, Target, main_dtype_of
from dtype_doctor.diagnosis import environment
from dtype_doctor.trace.guard import preserved
from dtype_doctor.numerics import device_name, dtype_name

# compare times real kernels, so a GPU this machine lacks cannot be simulated for it.
REAL_ONLY = "compare measures real tensors on a real device (scan --simulate checks a CUDA target)"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Setup:
    """A row ready to run: its model and inputs, and whether the model is a copy of its own."""

    model: torch.nn.Module
    inputs: Mapping[str, Any]
    autocast: str | None
    owned: bool  # a copy made for this row: the training step may change it
    fp32_modules: tuple[str, ...] | None = None
    note: str | None = None


@dataclass(frozen=True)
class Reference:
    """The fp32 run every row is measured against."""

    model: torch.nn.Module
    inputs: Mapping[str, Any]
    output_name: str
    output: torch.Tensor
    numerics: Numerics
    device: torch.device


def run(model: torch.nn.Module, inputs: Mapping[str, Any], request: CompareRequest, progress: Progress | None = None) -> Comparison:
    request.validate()
    say = progress or (lambda _msg: None)
    device = _device(model, request.device)
    ref_model = fp32_reference(model) if _is_on(model, device) else copy.deepcopy(model).to(device).float()
    ref_inputs = fp32_inputs({k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
    say("running the fp32 reference")
    try:
        (name, out), numerics = probe(ref_model, lambda: forward(ref_model, ref_inputs, None))
    except Exception as exc:  # noqa: BLE001 - nothing to compare against: the pipeline's own problem
        if is_out_of_memory(exc):
            raise  # the machine's limit, not the pipeline's: compare() names the batch size
        raise InputError(f"the fp32 forward fails, so there is nothing to compare against ({error_line(exc)}); `dtype-doctor scan` says why") from exc
    ref = Reference(ref_model, ref_inputs, name, out.detach(), numerics, device)
    rows = []
    wanted = request.rows()
    for i, v in enumerate(wanted, 1):
        say(f"measuring {v.label} (row {i} of {len(wanted)})")
        row = _row(v, ref, request)
        rows.append(replace(row, verdict=verdict(row)))
    return Comparison(
        target=_target(model, device, request),
        environment=environment(),
        output=name,
        peak_method=peak_method(device),
        repeat=request.repeat,
        rows=tuple(rows),
        recommendation=recommend(rows),
        gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        measures="forward + backward" if request.train else "forward",
    )


def _device(model: torch.nn.Module, decided: str | None) -> torch.device:
    """The device compare() decided at its entry; None: where the model is."""
    if decided is None:
        first = next((t for t in [*model.parameters(), *model.buffers()]), None)
        return first.device if first is not None else torch.device("cpu")
    return torch.device(decided)


def _is_on(model: torch.nn.Module, device: torch.device) -> bool:
    return all(t.device == device for t in [*model.parameters(), *model.buffers()])


def _target(model: torch.nn.Module, device: torch.device, request: CompareRequest) -> Target:
    subject = request.subject or Subject()
    sizes = [(dtype_name(p.dtype), p.numel()) for p in model.parameters() if p.is_floating_point()]
    return Target(
        model=subject.model or type(model).__name__, dataset=subject.dataset, split=subject.split,
        device=device_name(device), simulated=False, model_dtype=main_dtype_of(sizes), autocast=None, train=request.train,
    )


# ------------------------------------------------------------------ one row


def _row(v: Variant, ref: Reference, request: CompareRequest) -> Row:
    try:
        setup = _setup(v, ref)
    except Exception as exc:  # noqa: BLE001 - a row that cannot be built says why
        return Row(v, weight_bytes(ref.model), failure=error_line(exc))
    row = Row(v, weight_bytes(setup.model), fp32_modules=setup.fp32_modules, note=setup.note)
    if v.name == REFERENCE:
        numerics, output = ref.numerics, ref.output
    else:
        try:
            (_, output), numerics = probe(
                setup.model, lambda: forward(setup.model, setup.inputs, setup.autocast), ref.numerics.outputs
            )
        except Exception as exc:  # noqa: BLE001
            return replace(row, failure=error_line(exc))
        worst_op = worst(numerics.errors)
        row = replace(row, worst_op=worst_op, ops_compared=len(numerics.errors))
    before = set(ref.numerics.nonfinite)
    row = replace(
        row,
        output=_output_error(ref.output, output),
        nonfinite=numerics.nonfinite,
        overflowing=tuple(n for n in numerics.nonfinite if n not in before),
    )
    try:
        extra, times = _cost(setup, ref.device, request)
        row = replace(row, peak_bytes=row.weight_bytes + tensor_bytes(setup.inputs) + extra, times=times)
    except Exception as exc:  # noqa: BLE001
        return replace(row, failure=error_line(exc))
    work = setup.model if setup.owned else copy.deepcopy(setup.model)
    return replace(row, train_step=grad_scaler_step(work, setup.inputs, setup.autocast, ref.device))


def _setup(v: Variant, ref: Reference) -> Setup:
    if v.quantize == "mxfp8":
        from dtype_doctor.compare.mx import mx_copy

        model, note = mx_copy(ref.model, ref.device)
        inputs = {k: (t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for k, t in ref.inputs.items()}
        return Setup(model, inputs, None, owned=True, note=note)
    if v.quantize:
        from dtype_doctor.compare.quantized import quantize_copy

        model, note = quantize_copy(ref.model, v.quantize, ref.device)
        return Setup(model, ref.inputs, None, owned=True, note=note)
    if v.keep_fp32:
        return _keep_fp32_setup(ref)
    if v.weights == "float32":
        return Setup(ref.model, ref.inputs, v.autocast, owned=False)
    dtype = getattr(torch, v.weights)
    convert = {"float16": torch.nn.Module.half, "bfloat16": torch.nn.Module.bfloat16}[v.weights]
    model = convert(copy.deepcopy(ref.model))  # what the user types: model.half(), model.bfloat16()
    inputs = {k: (t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for k, t in ref.inputs.items()}
    return Setup(model, inputs, None, owned=True)


def _keep_fp32_setup(ref: Reference) -> Setup:
    # Another module's search; imported here so the rest of the table never waits on it.
    from dtype_doctor.fix.keep_fp32 import apply_keep_fp32, minimal_fp32_set

    found = minimal_fp32_set(ref.model, ref.inputs, dtype=torch.float16)
    model = apply_keep_fp32(copy.deepcopy(ref.model), found.modules, torch.float16)
    if not found.needed:
        note = "the plain fp16 conversion needs no fp32 modules"
    else:
        note = f"{len(found.modules)} module(s) kept in float32, found in {found.checks} checks"
        if not found.verified:
            note += f"; not verified: {found.reason}"
    # The inputs as the search ran them: the hooks apply_keep_fp32 installs cast them per module.
    return Setup(model, ref.inputs, None, owned=True, fp32_modules=found.modules, note=note)


def _output_error(ref: torch.Tensor, got: torch.Tensor) -> OutputError:
    measured = output_diff(ref, got)
    finite = bool(torch.isfinite(got).all())
    scale = ref.detach().float().abs().max().item() if ref.numel() else 0.0
    max_abs = measured.max_abs_diff if finite else float("inf")
    rel = max_abs / scale if scale else (0.0 if max_abs == 0 else float("inf"))
    return OutputError(max_abs, rel, min(measured.cosine, 1.0), finite)  # float32 rounding: 1.000001


def _cost(setup: Setup, device: torch.device, request: CompareRequest) -> tuple[int, tuple[float, ...]]:
    """(peak bytes beyond weights and inputs, seconds per timed run), after the warm-up runs."""
    step = _runner(setup, request.train)
    with preserved(setup.model, train=True) if request.train else contextlib.nullcontext():
        for _ in range(request.warmup):
            step()
        extra = run_peak(step, device)
        times = run_times(step, device, request.repeat)
    return extra, times


def _runner(setup: Setup, train: bool) -> Callable[[], Any]:
    model, inputs, autocast = setup.model, setup.inputs, setup.autocast
    if not train:
        return lambda: forward(model, inputs, autocast)
    device_type = next(iter(model.parameters())).device.type

    def step() -> None:
        for p in model.parameters():
            p.grad = None
        with torch.autocast(device_type, dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext():
            out = model(**inputs)
        loss = training_loss(out)
        if loss is not None and loss.requires_grad:
            loss.backward()

    return step
