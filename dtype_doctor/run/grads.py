"""A real `run`'s gradients, measured where they are made: at backward.

By the time the user's step ends, GradScaler has unscaled the gradients and the optimizer may
have cleared them. Each trainable parameter's gradient is measured by a post-accumulate hook
during the first backward, divided by the scale of the user's GradScaler when the loss was
scaled, so DD302 judges the gradients as the rules mean them (unscaled, with GradScaler's scale
known). The optimizer's own kernels are recorded, but their values are not the step's numerics:
statistics pause while it steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dtype_doctor.numerics import dtype_name
from dtype_doctor.records import GradStats
from dtype_doctor.trace.session import TraceSession


class StepGrads:
    def __init__(self, session: Callable[[], TraceSession | None], done: Callable[[], bool], scale: Callable[[], float | None]) -> None:
        self.session = session
        self.done = done
        self.scale = scale
        self.handles: dict[str, tuple[str, int | None]] = {}  # parameter → (grad dtype, value handle)
        self._hooks: dict[int, list[Any]] = {}  # per model armed
        self._paused: Any = None

    def arm(self, model: torch.nn.Module, prefix: str = "") -> None:
        """Measure `model`'s trainable gradients, named under `prefix` when it is one of several models
        (armed again under its name when a second model joins the step)."""
        for hook in self._hooks.pop(id(model), []):
            hook.remove()
        at = f"{prefix}." if prefix else ""
        self._hooks[id(model)] = [p.register_post_accumulate_grad_hook(self._hook(at + n))
                                  for n, p in model.named_parameters() if p.requires_grad]

    def disarm(self) -> None:
        for hooks in self._hooks.values():
            for hook in hooks:
                hook.remove()
        self._hooks = {}

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def measured(p: torch.Tensor) -> None:
            session = self.session()
            if self.done() or name in self.handles or session is None or session.recorder.values is None or p.grad is None:
                return
            from torch.utils._python_dispatch import _disable_current_modes

            scale = self.scale()
            with _disable_current_modes(), torch._C.DisableTorchFunction(), torch.no_grad():
                grad = p.grad.detach()
                self.handles[name] = (dtype_name(grad.dtype), session.recorder.observe([grad.float() / scale if scale else grad])[0])

        return measured

    def optimizer_stepping(self, on: bool) -> None:
        session = self.session()
        if session is None:
            return
        rec = session.recorder
        if on:
            self._paused, rec.values = rec.values, None
        elif self._paused is not None:
            rec.values, self._paused = self._paused, None

    def stats(self, values: Any) -> tuple[GradStats, ...]:
        return tuple(GradStats(n, d, s) for n, (d, h) in self.handles.items() if (s := values.get(h)) is not None)
