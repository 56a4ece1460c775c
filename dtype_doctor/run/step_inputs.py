"""Pipeline tensors the step uses outside the model, named where they meet the step's own tensors;
and the lines of the user's model code that make a tensor without device=."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode


# The factories a forward calls to make a tensor: without device= each makes it on the CPU.
FACTORIES = frozenset({
    torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.rand, torch.randn, torch.randint,
    torch.randperm, torch.eye, torch.linspace, torch.logspace, torch.tensor, torch.as_tensor,
})


class StepInputs(TorchFunctionMode):
    """Where a pipeline tensor (one with a lineage) meets the step's own tensors outside the model —
    `loss_fn(logits, target)`, `out @ proj` — it is named and tagged, so findings on it carry its lineage.
    Inside the model, a factory called without device= is noted with the user's line that called it."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        s = self.session
        traced = s.traced
        if traced is not None and s.model_depth == 0 and not traced.recorder.is_suspended and s.report is None:
            try:
                self._tag(func, args, kwargs)
            except Exception:  # noqa: BLE001 - naming must never break the script
                pass
        elif func in FACTORIES and "device" not in kwargs and s.model_depth > 0 and s.report is None:
            self.note_creation(func.__name__)
        return func(*args, **kwargs)

    def _tag(self, func: Any, args: tuple, kwargs: dict) -> None:
        s = self.session
        assert s.traced is not None
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if len(tensors) < 2:
            return
        # A pipeline tensor (one with a lineage) the step has not made; a loss target the step reshaped first
        # (`y.reshape(-1)`) is the recorder's too, and still the pipeline's target (never one named an input).
        rec = s.traced.recorder
        targets = [t for n, t in named_operands(func, args, kwargs) if n == "target" and isinstance(t, torch.Tensor)]
        new = [t for t in tensors if s.book.chain(t) and (not rec.knows(t) or (
            any(t is x for x in targets) and getattr(rec.prov.get(t), "kind", None) != "input"))]
        if not new or len(new) == len(tensors):
            return  # pipeline tensors among themselves (collate, stacking): not the step using them
        from_pipeline = [(n, t) for n, t in named_operands(func, args, kwargs) if any(t is x for x in new)]
        consumer = getattr(func, "__name__", str(func))
        for n, t in from_pipeline:
            self.tag_step_input(n, t, consumer)

    def tag_step_input(self, name: str, t: torch.Tensor, consumer: str) -> None:
        tag_pipeline_tensor(self.session, name, t, consumer)

    def note_creation(self, factory: str) -> None:
        """The model's code called `factory` (torch.arange, torch.zeros…) without device=: its user line."""
        from dtype_doctor.machine.user_code import user_site

        s = self.session
        site = user_site(1)
        if site is not None:
            sites = s.created.setdefault(factory, [])
            if site not in sites:
                sites.append(site)


def tag_pipeline_tensor(s: Any, name: str, t: torch.Tensor, consumer: str, *, boundary: bool = False) -> None:
    """A pipeline tensor the step uses outside the model (a loss target), or a model joining the step takes
    (`boundary`: a GAN generator's noise), in the session `s`: named, with its lineage."""
    from dtype_doctor.run.lineage import as_handled, step_input_lineage

    assert s.traced is not None
    rec = s.traced.recorder
    taken = set(s.lineage) | {m.name for m in rec.boundary_inputs}
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name}_{i}", i + 1
    rec.tag_input(unique, t)
    s.lineage[unique] = step_input_lineage(s.book, t, consumer, name, boundary=boundary)
    if (handled := s.book.handled.get(t)) is not None:
        s.handled[unique] = as_handled(handled, s.book.handled_from.get(t))


def named_operands(func: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    import inspect

    try:
        bound = inspect.signature(func).bind_partial(*args, **kwargs)
        return list(bound.arguments.items())
    except (TypeError, ValueError):
        positional = ["input", "other"] + [f"arg{i}" for i in range(2, len(args))]
        return [*zip(positional, args), *kwargs.items()]
