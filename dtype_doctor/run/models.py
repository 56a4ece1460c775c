"""The models a script's step calls, each named as the script holds it: `StepModels`.

A script may call several models in one step: a diffusers pipeline's text encoder, UNet and VAE,
a teacher and a student, a reward model and a policy. Each is named once, where it is first
called, by what holds it in the user's code: the pipeline's component name (`pipe.components`
maps names to modules) when a diffusers pipeline holds it, else the script's variable (or its
`self.` attribute). A module called on its own inside such a holder (`vae.decoder`, which
`vae.decode()` calls) is traced as part of its holder, under the holder's name ("vae.decoder...").

The report's model is `diagnose_pipeline`'s container, dtype_doctor.diffusion.PipelineComponents:
the holders as one module whose children are named so, read by `model_info` as a pipeline traced as
one (`pipeline_components`), so module paths, parameters, `target.components` and the component
rules (DD801, DD802) read as `diagnose_pipeline`'s.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from dtype_doctor.records import ModelInfo

if TYPE_CHECKING:
    from dtype_doctor.diffusion import PipelineComponents


@dataclass(frozen=True)
class Holder:
    """What holds a called module in the user's code: its name there and the module it names."""

    name: str
    module: torch.nn.Module
    pipeline: Any = None  # the diffusers pipeline whose component it is, if one is


def is_pipeline(obj: Any) -> bool:
    """A diffusers pipeline (without importing diffusers): its class derives from DiffusionPipeline."""
    return not isinstance(obj, torch.nn.Module) and any(
        c.__name__ == "DiffusionPipeline" and c.__module__.startswith("diffusers") for c in type(obj).__mro__)


def pipeline_modules(pipeline: Any) -> dict[str, torch.nn.Module]:
    """The pipeline's components that are torch modules, by component name."""
    from dtype_doctor.diffusion import modules_of

    return modules_of(pipeline)


def holder_of(module: torch.nn.Module, frame: FrameType | None) -> Holder | None:
    """What holds `module` in the user's frame: a pipeline's component, a variable, a `self.` attribute."""
    if frame is None:
        return None
    scopes: list[dict[str, Any]] = [frame.f_locals, frame.f_globals]
    owner = frame.f_locals.get("self")
    if owner is not None and isinstance(getattr(owner, "__dict__", None), dict):
        scopes.insert(1, {**owner.__dict__, **(owner.__dict__.get("_modules") or {})})
    for exact in (True, False):
        for scope in scopes:
            for key, value in list(scope.items()):
                if key.startswith("_") or key == "self":  # `self` is read by its attributes (self.teacher)
                    continue
                found = _held(module, key, value, exact)
                if found is not None:
                    return found
    return None


def _held(module: torch.nn.Module, key: str, value: Any, exact: bool) -> Holder | None:
    if is_pipeline(value):
        for name, c in pipeline_modules(value).items():
            if c is module or (not exact and _contains(c, module)):
                return Holder(name, c, value)
        return None
    if isinstance(value, torch.nn.Module) and (value is module or (not exact and _contains(value, module))):
        return Holder(key, value)
    return None


def _contains(outer: torch.nn.Module, module: torch.nn.Module) -> bool:
    return any(m is module for m in outer.modules())


def path_in(holder: torch.nn.Module, module: torch.nn.Module) -> str | None:
    """`module`'s dotted path inside `holder` ("" for the holder itself)."""
    return next((n for n, m in holder.named_modules() if m is module), None)


def running_pipeline(module: torch.nn.Module) -> Any:
    """The diffusers pipeline whose method is running `module` now, found on the call stack (outermost
    first), or None. The call, not the script's names, says which pipeline holds the module: a script
    that keeps its components in variables of their own (`text_encoder = CLIPTextModel(...)`, then
    `StableDiffusionPipeline(text_encoder=text_encoder, ...)`) still runs them as the pipeline's."""
    found = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and is_pipeline(owner) and any(
                c is module or _contains(c, module) for c in pipeline_modules(owner).values()):
            found = owner
        frame = frame.f_back
    return found


def pipeline_call(pipeline: Any) -> FrameType | None:
    """The outermost frame on the stack running one of `pipeline`'s methods: its `pipe(...)` call."""
    found = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_locals.get("self") is pipeline:
            found = frame
        frame = frame.f_back
    return found


def on_stack(target: FrameType) -> bool:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame is target:
            return True
        frame = frame.f_back
    return False


def unique(name: str, taken: set[str]) -> str:
    out, i = name.replace(".", "_"), 2
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    return out


class StepModels:
    """Which models the step called, under which names, and which of their calls repeat one already traced.

    The first model is traced alone, as before, until a second one is called (or at once, when a
    pipeline holds it): from then on it is named too (`first_name`). A model called again in the
    same step (a denoising loop's UNet, the negative prompt's text encoder) is a repeat: its ops
    add nothing the first call did not say, and are dropped (`repeats` counts them). Within a
    pipeline's call, the first model called again is a repeat, not the next step.
    """

    def __init__(self) -> None:
        self.first: torch.nn.Module | None = None
        self.holders: dict[int, Holder] = {}  # by the holder module's id, in the order first called
        self._of: dict[int, Holder] = {}  # a called module's id → its holder
        self.several = False
        self.pipeline: Any = None
        self._pipeline_call: FrameType | None = None
        self._called: set[int] = set()
        self.repeats: dict[str, int] = {}  # model name → its calls not traced
        self._with_grad: dict[str, bool] = {}  # holder name → whether any of its calls ran with gradients on
        self.sites: dict[str, Any] = {}  # model name → the user's line that first called it

    def expect(self, pipeline: Any) -> None:
        """The pipeline the step will run, known before it runs: the caller is the doctor itself
        (`scan PIPELINE_DIR --simulate`), so no user frame holds it to be found by."""
        self.pipeline = pipeline

    def begin(self, model: torch.nn.Module, frame: FrameType | None) -> None:
        self.first = model
        self._called = {id(model)}
        if self.pipeline is None:
            self.pipeline = running_pipeline(model)
        holder = self._holder(model, frame)
        if holder.pipeline is not None:
            self.pipeline = holder.pipeline
            self._pipeline_call = pipeline_call(holder.pipeline)

    def first_name(self) -> str:
        assert self.first is not None
        holder = self._of[id(self.first)]
        path = path_in(holder.module, self.first)
        return f"{holder.name}.{path}" if path else holder.name

    def holder(self, module: torch.nn.Module, frame: FrameType | None) -> Holder:
        return self._of.get(id(module)) or self._holder(module, frame)

    def _holder(self, module: torch.nn.Module, frame: FrameType | None) -> Holder:
        found = ((self._component(module) if self.pipeline is not None else None) or holder_of(module, frame)
                 or Holder(type(module).__name__, module))
        known = self.holders.get(id(found.module))
        if known is None:
            known = Holder(unique(found.name, {h.name for h in self.holders.values()}), found.module, found.pipeline)
            self.holders[id(known.module)] = known
        self._of[id(module)] = known
        return known

    def _component(self, module: torch.nn.Module) -> Holder | None:
        for name, c in pipeline_modules(self.pipeline).items():
            if c is module or _contains(c, module):
                return Holder(name, c, self.pipeline)
        return None

    def within_pipeline_call(self) -> bool:
        """The script's pipeline call that began the step is still running (its UNet loop, its decode)."""
        return self._pipeline_call is not None and on_stack(self._pipeline_call)

    def repeated(self, module: torch.nn.Module, name: str) -> bool:
        """Whether this top-level call of `module` repeats one the step already traced (counted if so)."""
        if id(module) in self._called:
            self.repeats[name] = self.repeats.get(name, 0) + 1
            return True
        self._called.add(id(module))
        return False

    def called(self, module: torch.nn.Module) -> None:
        """A call of `module` ran: with gradients on, or (a teacher under torch.no_grad()) off."""
        holder = self._of.get(id(module))
        if holder is not None:
            self._with_grad[holder.name] = self._with_grad.get(holder.name, False) or torch.is_grad_enabled()

    def frozen(self, info: ModelInfo) -> ModelInfo:
        """`info` with the parameters of each model the step only called under no_grad (a teacher) not
        trainable in it: they train nowhere, whatever their requires_grad (DD110, DD401 read it)."""
        frozen = {name for name, grad in self._with_grad.items() if not grad}
        if not frozen:
            return info
        state = tuple(dataclasses.replace(s, requires_grad=False)
                      if s.kind == "parameter" and s.requires_grad and info.component_of(s.name) in frozen else s
                      for s in info.state)
        return dataclasses.replace(info, state=state)

    def next_step(self) -> None:
        self._called = {id(self.first)}
        self._pipeline_call = pipeline_call(self.pipeline) if self.pipeline is not None else None

    def done(self) -> None:
        self._pipeline_call = None  # the frame and what it holds go

    def root(self) -> "PipelineComponents":
        """The report's model: every model the step called, and a pipeline's other components, by name."""
        holders = list(self.holders.values())
        if self.pipeline is not None:  # the pipeline's components in its own order, then the script's other models
            own = {id(h.module): h for h in holders}
            components = [own.get(id(m)) or Holder(n, m, self.pipeline) for n, m in pipeline_modules(self.pipeline).items()]
            holders = components + [h for h in holders if all(h.module is not c.module for c in components)]
        from dtype_doctor.diffusion import PipelineComponents

        return PipelineComponents(self.pipeline, {h.name: h.module for h in holders}, name=" + ".join(h.name for h in holders))


def has_parameters(module: torch.nn.Module) -> bool:
    """Whether `module` holds a parameter of its own or of a child: what a model the step calls has."""
    return next(module.parameters(), None) is not None


def is_model_call(module: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """A module with parameters called on data: not weight_norm's ParametrizationList, which
    `.half()` or reading a parametrized weight calls at top level with no input."""
    from torch.nn.utils.parametrize import ParametrizationList

    if isinstance(module, ParametrizationList) or not has_parameters(module):
        return False
    return any(holds_tensor(v) for v in (*args, *kwargs.values()))


def holds_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return any(holds_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(holds_tensor(v) for v in obj)
    return False
