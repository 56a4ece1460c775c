"""Where a training step ends, and what the trace reached of it: `StepWatch`.

A GPU's step ends after the optimizer: forward, loss, backward, GradScaler's
scale / unscale_ / step / update, `optimizer.step()`, `zero_grad()`. While the script runs,
torch's global optimizer-step hooks count optimizer steps, `Optimizer.__init__` and
`GradScaler.__init__` say whether the script has an optimizer and an enabled scaler, and
GradScaler's methods say which of its phases ran. `--steps N` counts optimizer steps (model
forward calls where the script has no optimizer), so an evaluation before the first training
iteration (`estimate_loss()`) or gradient accumulation is part of the traced step.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dtype_doctor.records import PHASES, Coverage, OptimizerGroup, Trace, coverage_of

_SCALER_METHODS = ("scale", "unscale_", "step", "update")


class StepWatch:
    """`with StepWatch(is_tracing) as w:` — counts what the script's step does while `is_tracing()`."""

    def __init__(self, is_tracing: Callable[[], bool], in_optimizer: Callable[[bool], None] = lambda _on: None) -> None:
        self.is_tracing = is_tracing
        self.in_optimizer = in_optimizer  # called with True before an optimizer step while tracing, False after
        self.optimizers = 0  # optimizers the script created
        self.scalers = 0  # enabled GradScalers the script created
        self.optimizer_steps = 0  # optimizer steps taken while tracing
        self.scaler_calls: list[str] = []  # GradScaler methods called while tracing, in order
        self.zero_grad = False
        self.scaler: Any = None  # the enabled GradScaler whose scale() the step called
        self.scaler_off: Any = None  # the user's line that made a disabled GradScaler (a SourceLoc), the last one
        self._optimizers: list[Any] = []  # weak references to the optimizers the script made
        self._saved: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    def __enter__(self) -> "StepWatch":
        from torch.amp.grad_scaler import GradScaler
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        watch = self

        def stepping(optimizer: Any, args: Any, kwargs: Any) -> None:
            if watch.is_tracing():
                watch.in_optimizer(True)

        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            if watch.is_tracing():
                watch.optimizer_steps += 1
                watch.in_optimizer(False)

        self._handles = [register_optimizer_step_pre_hook(stepping), register_optimizer_step_post_hook(stepped)]
        self._wrap(torch.optim.Optimizer, "__init__", lambda o, *a, **k: watch._optimizer_made(o))
        self._wrap(torch.optim.Optimizer, "zero_grad", lambda o, *a, **k: watch._zero_grad())
        self._wrap(GradScaler, "__init__", lambda s, *a, **k: watch._scaler_made(s))
        for name in _SCALER_METHODS:
            self._wrap(GradScaler, name, lambda s, *a, _name=name, **k: watch._scaler(s, _name))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _wrap(self, owner: Any, name: str, after: Callable[..., None]) -> None:
        original = owner.__dict__[name]

        def wrapped(obj: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(obj, *args, **kwargs)
            try:
                after(obj, *args, **kwargs)
            except Exception:  # noqa: BLE001 - bookkeeping never breaks the script
                pass
            return out

        wrapped.__wrapped__ = original  # type: ignore[attr-defined]
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapped)

    def _scaler_made(self, scaler: Any) -> None:
        """A GradScaler was made: counted when enabled; the methods a subclass overrides (ShardedGradScaler's
        scale, unscale_, update) are watched too, from then on."""
        self.scalers += bool(scaler.is_enabled())
        if not scaler.is_enabled():
            from dtype_doctor.machine.user_code import user_site

            self.scaler_off = user_site(0) or self.scaler_off
        for cls in type(scaler).__mro__:
            if cls.__module__.startswith("torch.amp"):
                break
            for name in _SCALER_METHODS:
                if name in cls.__dict__ and not any(o is cls and n == name for o, n, _ in self._saved):
                    self._wrap(cls, name, lambda s, *a, _name=name, **k: self._scaler(s, _name))

    def _optimizer_made(self, optimizer: Any) -> None:
        import weakref

        self.optimizers += 1
        self._optimizers.append(weakref.ref(optimizer))

    def optimizer_groups(self) -> tuple[OptimizerGroup, ...]:
        """Each param group of the script's optimizers (alive), with its lr, eps and parameter dtypes."""
        from dtype_doctor.numerics import dtype_name

        groups = []
        for ref in self._optimizers:
            opt = ref()
            for g in opt.param_groups if opt is not None else ():
                params = [p for p in g.get("params", ()) if isinstance(p, torch.Tensor)]
                eps, lr = g.get("eps"), g.get("lr")
                groups.append(OptimizerGroup(type(opt).__name__, float(lr) if isinstance(lr, (int, float)) else None,
                                             float(eps) if isinstance(eps, (int, float)) else None,
                                             tuple(sorted({dtype_name(p.dtype) for p in params})), len(params)))
        return tuple(groups)

    def _zero_grad(self) -> None:
        if self.is_tracing():
            self.zero_grad = True

    def _scaler(self, scaler: Any, name: str) -> None:
        if self.is_tracing() and scaler.is_enabled():
            self.scaler_calls.append(name)
            if name == "scale":
                self.scaler = scaler

    def scale(self) -> float | None:
        """The scale the step's loss was multiplied by (its GradScaler's), or None without one."""
        if self.scaler is None or not self.scaler.is_enabled():
            return None
        return float(self.scaler.get_scale())

    def scaler_class(self) -> str | None:
        """The class of the GradScaler the step scaled its loss with, as "module.QualName"."""
        if self.scaler is None:
            return None
        cls = type(self.scaler)
        return f"{cls.__module__}.{cls.__qualname__}"

    # ----------------------------------------------------------------- results

    def step_done(self, forwards: int, steps: int) -> bool:
        """Whether the step(s) asked for are over when the model is called for the `forwards`-th time."""
        if self.optimizers:
            return self.optimizer_steps >= steps
        return forwards > steps

    def steps(self, forwards: int) -> int:
        return self.optimizer_steps if self.optimizers else forwards

    def coverage(self, trace: Trace, forwards: int, stopped: str | None) -> Coverage:
        seen = coverage_of(trace)
        phases = set(seen.phases)
        if self.scaler_calls:
            phases.add("scaler")
        if self.optimizer_steps:
            phases.add("optimizer")
        expected = {"forward"}
        if self.optimizers or "backward" in phases:
            expected |= {"loss", "backward"}
        if self.scalers or self.scaler_calls:
            expected.add("scaler")
        if self.optimizers:
            expected.add("optimizer")
        return Coverage(
            phases=tuple(p for p in PHASES if p in phases),
            expected=tuple(p for p in PHASES if p in expected),
            modules_called=seen.modules_called,
            modules_total=seen.modules_total,
            ops=seen.ops,
            stand_ins=len(trace.stand_ins),
            steps=self.steps(forwards),
            stopped=stopped or seen.stopped,
        )


def stopped_early(error: BaseException | None, failure: Any) -> str | None:
    """Where and why the trace ended before the step's end (`error` ended the script), or None."""
    from dtype_doctor.records.errors import first_line
    from dtype_doctor.records.errors import StopScript
    from dtype_doctor.machine.user_code import user_frame
    from dtype_doctor.machine.simulate import SimulationStop

    if isinstance(error, SimulationStop):
        if error.limit is not None:
            return f"at {error.where}: {error.limit_short}, a limit of the simulation"
        return f"at {error.where}: {error.what} needs a value a simulated tensor does not hold"
    if failure is not None:
        return None  # coverage_of words the failure
    if error is None or isinstance(error, (StopScript, KeyboardInterrupt)):
        return None
    from dtype_doctor.machine.control import UserCodeTimeout

    if isinstance(error, UserCodeTimeout):  # the doctor's time limit, not the script's failure
        waiting = f", {error.waiting}" if error.waiting else ""  # what it waited on (a DataLoader worker, machine/workers.py)
        return (f"the script ran past --timeout and was stopped{user_frame(error)}{waiting}, before its step ended "
                "(raise --timeout, or 0 for no limit)")
    if isinstance(error, SystemExit):
        return None if error.code in (None, 0) else f"the script exited with {error.code!r}"
    return f"the script raised {type(error).__name__}{user_frame(error)}: {first_line(error)}"
