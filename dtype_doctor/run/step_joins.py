"""How a run's step takes the top-level module calls beside its first model (run/session.py's
RunSession asks): the script's own head on the model's hidden states, a second model (a teacher,
a pipeline's components), a model called again in the step. Moved out of RunSession as it was, so
the session holds the script's execution and this module the step's models.
"""

from __future__ import annotations

from typing import Any

import torch

from dtype_doctor.machine.user_code import first_user_frame, frames_above, user_site
from dtype_doctor.run.lineage import joined_inputs
from dtype_doctor.run.models import is_model_call
from dtype_doctor.run.step_inputs import tag_pipeline_tensor


REPEAT = "repeat"  # a model's call again in the step: recorded and repaired, its ops dropped
UNWATCHED = "unwatched"  # a repeat run with the recorder off, at the script's own pace


class StepJoins:
    """The step's models as the session's calls meet them; `session` is the RunSession (its `traced`
    TraceSession, `model`, `models`, `grads`, `capture` and `placement`)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.unwatched = 0  # repeated calls run at the script's own pace, the recorder off
        self._checked = 0  # the recorder's ops looked at for a repair so far
        self._repaired = False  # an op of the step so far was repaired: its repeats must be watched too

    def joined(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[bool, str | None] | None:
        """How the step takes a top-level call beside its first model: (a model's forward, REPEAT or UNWATCHED
        for a repeat, else None), or None where it is not the step's (a module called with no tensor,
        weight_norm's parametrization)."""
        s = self.session
        assert s.traced is not None
        rec = s.traced.recorder
        models = s.models
        if models.pipeline is None and module is not s.model and self.on_step_tensors(args, kwargs):
            # Part of the step: the script's own head on the model's hidden states, a GAN's discriminator.
            rec.adopt(module, script_name(module))
            return False, self.repeat(module, rec.module_name(module) or "")
        if module is not s.model and not is_model_call(module, args, kwargs):
            return None
        holder = models.holder(module, user_frame_of_call())
        self.several_models()
        if rec.module_name(holder.module) is None and not s.placement.simulated:
            s.grads.arm(holder.module, holder.name)  # a model joining the step: its gradients too
        rec.adopt(holder.module, holder.name, model=holder.module is module)
        rec.adopt(module, holder.name, model=True)  # its forward is a model's, named under its holder
        for input_name, t in joined_inputs(s.book, module, args, kwargs).items():  # a GAN generator's noise
            tag_pipeline_tensor(s, input_name, t, holder.name, boundary=True)
        name = rec.module_name(module) or holder.name
        if holder.name not in models.sites:
            models.sites[holder.name] = user_site(2)
        return True, self.repeat(module, name)

    def repeat(self, module: torch.nn.Module, name: str) -> str | None:
        """With several models, a model called again in the step is run unwatched (UNWATCHED) where it may
        be, else recorded (and repaired) but dropped (REPEAT); another model's first call ends what a repeat
        in a pipeline's loop began dropping."""
        s = self.session
        if not s.models.several:
            return None
        rec = s.traced.recorder
        if s.models.repeated(module, name):
            if self.may_go_unwatched():
                self.unwatched += 1
                return UNWATCHED
            rec.pause_keeping()
            return REPEAT
        rec.resume_keeping()
        return None

    def may_go_unwatched(self) -> bool:
        """Whether a repeated call may run with the recorder off: on a real machine (a simulated one keeps
        its recorder, whose stand-ins the script needs), and only while nothing the step ran so far needed a
        repair or failed (a repeat of a call that was repaired would fail unwatched, so it stays watched)."""
        s = self.session
        if s.placement.simulated or s.failure is not None or self._repaired:
            return False
        ops = s.traced.recorder.ops
        self._repaired = any(op.recovered or op.error for op in ops[self._checked:])
        self._checked = len(ops)
        return not self._repaired

    def several_models(self) -> None:
        """The step calls more than one model: the first is named as the others are, from here on and back."""
        s = self.session
        models = s.models
        if not models.several:
            models.several = True
            models.sites.setdefault(models.first_name().split(".", 1)[0], s.capture.call_site if s.capture else None)
            s.traced.recorder.name_root(models.first_name())
            if not s.placement.simulated:
                s.grads.arm(s.model, models.first_name())

    def next_step(self) -> None:
        s = self.session
        if s.models.several:
            s.traced.recorder.resume_keeping()
            s.models.next_step()

    def on_step_tensors(self, args: tuple, kwargs: dict) -> bool:
        """A module called on what the step made (the script's own head on the model's hidden states) is
        part of the step, and traced with it; one called on the batch (a teacher) is another model."""
        traced = self.session.traced
        if traced is None:
            return False
        knows = traced.recorder.knows
        return any(isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and knows(t) and t.grad_fn is not None
                   for t in (*args, *kwargs.values()))


def script_name(module: torch.nn.Module) -> str:
    """What the script calls a module it runs beside the model (`head`), else its class."""
    frame = first_user_frame(frames_above(1))
    if frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            name = next((k for k, v in scope.items() if v is module and not k.startswith("_")), None)
            if name is not None:
                return name
    return type(module).__name__


def user_frame_of_call() -> Any:
    """The user's frame that made the module call being handled."""
    return first_user_frame(frames_above(2))
