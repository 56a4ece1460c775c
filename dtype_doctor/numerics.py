"""Shared numerics of a model's output, one definition each: forward it, take its primary output,
its loss, compare two outputs, and each module's largest |value|.

fix (parity, the trade-off, overflow evidence), keep-fp32 (its checks) and compare (its rows)
all measure with these; the trace uses `loss_of` for its backward. Torch is imported here: the
callers already run a model.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch

from dtype_doctor.records import dtype_name, main_dtype_of

__all__ = ["dtype_name"]  # re-exported: the one definition lives in records (torch-free)


def device_name(device: torch.device) -> str:
    """'cuda:0' for a bare 'cuda': a device as the user's code names it."""
    if device.type == "cuda" and device.index is None:
        return "cuda:0"
    return str(device)


def tensors_in(*objs: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `objs`: in dicts, lists, tuples and transformers' ModelOutput."""
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            yield from tensors_in(*obj.values())
        elif isinstance(obj, (list, tuple)):
            yield from tensors_in(*obj)
        elif hasattr(obj, "to_tuple"):  # transformers ModelOutput
            yield from tensors_in(*obj.to_tuple())


def main_dtype(model: torch.nn.Module) -> str:
    """The dtype most of the model's floating parameter elements have (float32 with none)."""
    return main_dtype_of((dtype_name(p.dtype), p.numel()) for p in model.parameters()) or "float32"


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's parameters and buffers hold."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def fp32_reference(model: torch.nn.Module) -> torch.nn.Module:
    """The model in float32: itself when it is, else a float32 copy."""
    floating = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return model if floating <= {torch.float32} else copy.deepcopy(model).float()


def fp32_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The batch with its floating tensors in float32 (indices and labels as they are)."""
    return {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}


@contextlib.contextmanager
def config_kept(model: torch.nn.Module) -> Iterator[None]:
    """The config's attributes as they were after the block. A forward decides some as it runs:
    transformers' classification heads store the problem_type the first labels' dtype chose (DD111)."""
    config = getattr(model, "config", None)
    saved = dict(vars(config)) if config is not None and hasattr(config, "__dict__") else None
    try:
        yield
    finally:
        if saved is not None:
            for key in [k for k in vars(config) if k not in saved]:
                del vars(config)[key]
            vars(config).update(saved)


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode for the block; each module's own training flag and the config restored after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with config_kept(model):
            yield
    finally:
        for m, flag in flags:
            m.training = flag


def forward(model: torch.nn.Module, inputs: Mapping[str, Any], autocast: str | None) -> tuple[str, torch.Tensor]:
    """One eval-mode forward (under autocast in that dtype, if given): its primary output, detached.

    It runs in the caller's grad mode, as the plain `model(**inputs)` does: libraries choose their
    kernels by it (bitsandbytes' CPU path for 4-bit weights differs with and without grad)."""
    state = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = state.device if state is not None else torch.device("cpu")
    with evaluating(model), contextlib.ExitStack() as stack:
        if autocast:
            stack.enter_context(torch.autocast(device.type, dtype=getattr(torch, autocast)))
        out = model(**inputs)
    name, primary = primary_output(out)
    return name, primary.detach()


PRIMARY_KEYS = ("logits", "last_hidden_state", "prediction_logits", "start_logits")


def primary_output(out: Any) -> tuple[str, torch.Tensor]:
    """The output a user reads (name, tensor): a tensor itself, else logits, a last hidden state,
    ..., else the first floating tensor that is not the loss. StopIteration with none;
    TypeError for an output that is neither a tensor, a mapping nor a sequence."""
    if isinstance(out, torch.Tensor):
        return "output", out
    items = out.items() if isinstance(out, Mapping) else enumerate(out)
    named = {str(k): v for k, v in items if isinstance(v, torch.Tensor) and v.is_floating_point()}
    for key in PRIMARY_KEYS:
        if key in named:
            return key, named[key]
    key = next((k for k in named if k != "loss"), None) or next(iter(named))
    return key, named[key]


def loss_of(out: Any, reduce: str = "mean") -> torch.Tensor | None:
    """The loss of an output: the model's own (`out.loss`); without one, its primary output in
    float32 reduced to a scalar (`mean`, as losses are; `sum`); None when it has no floating output."""
    if isinstance(out, torch.Tensor):
        loss = None
    elif isinstance(out, Mapping):  # a ModelOutput is a Mapping too; a plain dict has no .loss
        loss = out.get("loss")
    else:
        loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    try:
        primary = primary_output(out)[1].float()
    except (StopIteration, TypeError):
        return None
    return primary.sum() if reduce == "sum" else primary.mean()


@dataclass(frozen=True, slots=True)
class OutputDiff:
    """An output against its float32 reference."""

    max_abs_diff: float
    cosine: float


def output_diff(ref: torch.Tensor, got: torch.Tensor) -> OutputDiff:
    """Largest |difference| and cosine similarity (6 places) of two outputs, in float32."""
    a, b = ref.detach().float().flatten(), got.detach().float().flatten()
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=0).item() if a.numel() else 1.0
    return OutputDiff((a - b).abs().max().item() if a.numel() else 0.0, round(cosine, 6))


@contextlib.contextmanager
def module_peaks(
    model: torch.nn.Module,
    *,
    select: Callable[[torch.nn.Module], bool] = lambda m: True,
    with_inputs: bool = False,
) -> Iterator[dict[str, float]]:
    """Which module overflows: while the block runs forwards, the dict it yields fills with each
    selected module's largest |value| of its floating outputs (and inputs, `with_inputs`)."""
    peaks: dict[str, float] = {}
    names = {id(m): n for n, m in model.named_modules()}

    def record(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        seen = tensors_in(*args, *kwargs.values(), out) if with_inputs else tensors_in(out)
        values = [t.detach().abs().max().item() for t in seen if t.is_floating_point() and t.numel()]
        if values:
            name = names.get(id(module), "")
            peaks[name] = max(peaks.get(name, 0.0), *values)
        elif with_inputs:
            peaks.setdefault(names.get(id(module), ""), 0.0)

    handles = [m.register_forward_hook(record, with_kwargs=True) for m in model.modules() if select(m)]
    try:
        yield peaks
    finally:
        for h in handles:
            h.remove()
