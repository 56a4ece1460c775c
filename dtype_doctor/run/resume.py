"""Resuming from a checkpoint, watched: each `load_state_dict` of a model, an optimizer or a GradScaler
(its line), what the load cast on its way in (torch casts an optimizer's floating state to its
parameter's dtype and device; a model's load_state_dict copies into parameters of their own dtype),
and, when an optimizer steps, each state tensor of another dtype or device than its parameter
(Adam's `exp_avg.lerp_(grad)` refuses float32 state beside bfloat16 gradients). See docs/precision.md.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from dtype_doctor.machine.user_code import user_site
from dtype_doctor.numerics import device_name, dtype_name
from dtype_doctor.records.resume import Restored, Resume, StateCast, StateMismatch


def _floating(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0


def _called_by_user() -> bool:
    from dtype_doctor.machine.user_code import first_outside_tool, frames_above, is_user_file

    frame = first_outside_tool(frames_above(2))
    return frame is not None and is_user_file(frame.f_code.co_filename)


def _meta(t: torch.Tensor, alias: dict[str, str]) -> str:
    device = device_name(t.device)
    return f"{dtype_name(t.dtype)} {alias.get(device, device)}"


class ResumeWatch:
    """`with ResumeWatch(names) as w:` the script runs; `w.facts()` is what its resume did. `names()` maps
    id(parameter) → its name in the traced model."""

    def __init__(self, names: Callable[[], dict[int, str]] = dict, alias: dict[str, str] | None = None,
                 is_on: Callable[[], bool] = lambda: True, ops: Callable[[], Sequence[Any]] = tuple) -> None:
        self.names, self.alias, self.is_on = names, dict(alias or {}), is_on
        self.ops = ops  # the trace's ops so far: those an optimizer step refused were repaired by the recorder, not stepped
        self.refused_ops: list[int] = []
        self._ops_before: dict[int, int] = {}
        self.restored: list[Restored] = []
        self.casts: list[StateCast] = []
        self.mismatches: list[StateMismatch] = []
        self._loaded_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pending: dict[int, list[StateMismatch]] = {}
        self._params: dict[int, Any] = {}  # id(StateCast) → its parameter (weakly): named once the model is known
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "ResumeWatch":
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._wrap(torch.optim.Optimizer, "optimizer", self._optimizer_load)
        self._wrap(torch.nn.Module, "model", self._model_load)
        self._wrap(torch.amp.GradScaler, "scaler", None)
        pre, post = register_optimizer_step_pre_hook(self._before_step), register_optimizer_step_post_hook(self._after_step)
        self._undo += [pre.remove, post.remove]
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, cls: type, kind: str, inspect: Callable[..., Iterator[StateCast]] | None) -> None:
        original = cls.load_state_dict
        watch = self

        def load_state_dict(obj: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            site = user_site(1)
            # a model's load by a library (a loader that converts on purpose) is the library's; the script's own is the resume
            mine = kind != "model" or _called_by_user()
            before = list(inspect(obj, state_dict, site)) if inspect is not None and mine else []
            out = original(obj, state_dict, *args, **kwargs)
            watch.restored.append(Restored(kind, type(obj).__name__, site))
            if kind == "optimizer":
                watch._loaded_at[obj] = site
                before = [c for c in before if c.loaded != c.saved]
            watch.casts.extend(before)
            return out

        load_state_dict.__wrapped__ = original  # type: ignore[attr-defined]
        cls.load_state_dict = load_state_dict  # type: ignore[method-assign]
        self._undo.append(lambda: setattr(cls, "load_state_dict", original))

    def _optimizer_load(self, opt: torch.optim.Optimizer, state_dict: Any, site: Any) -> Iterator[StateCast]:
        """Saved floating state → the dtype torch's load gives it: its parameter's (Optimizer._process_value_according_to_param_policy)."""
        params = [p for g in opt.param_groups for p in g["params"]]
        names = self.names()
        for index, state in (state_dict.get("state") or {}).items():
            if not isinstance(index, int) or index >= len(params):
                continue
            p = params[index]
            for key, v in state.items():
                if _floating(v) and key != "step" and v.dtype != p.dtype:
                    cast = StateCast("optimizer", type(opt).__name__, names.get(id(p), f"param {index}"), key,
                                     dtype_name(v.dtype), dtype_name(p.dtype), site)
                    self._params[id(cast)] = (cast, weakref.ref(p))
                    yield cast

    def _model_load(self, module: torch.nn.Module, state_dict: Any, site: Any) -> Iterator[StateCast]:
        """Saved tensors copied into parameters and buffers of another dtype: counted by (saved, own) dtype."""
        own = {k: v for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
        counts: dict[tuple[str, str], list[str]] = {}
        for name, saved in state_dict.items() if hasattr(state_dict, "items") else ():
            mine = own.get(name)
            if mine is not None and _floating(saved) and mine.is_floating_point() and saved.dtype != mine.dtype:
                counts.setdefault((dtype_name(saved.dtype), dtype_name(mine.dtype)), []).append(name)
        for (saved_dtype, own_dtype), names in counts.items():
            yield StateCast("model", type(module).__name__, names[0], "", saved_dtype, own_dtype, site, len(names))

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.is_on():
            return
        names, found = self.names(), []
        for group in opt.param_groups:
            for p in group["params"]:
                for key, v in opt.state.get(p, {}).items():
                    if key != "step" and _floating(v) and v.shape == p.shape and (v.dtype != p.dtype or v.device != p.device):
                        found.append(StateMismatch(type(opt).__name__, names.get(id(p), "a parameter"), key, _meta(v, self.alias),
                                                   _meta(p, self.alias), user_site(1), False, self._loaded_at.get(opt)))
        self._ops_before[id(opt)] = len(self.ops())
        if found:
            self._pending[id(opt)] = found
            self.mismatches.extend(found)

    def _after_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The step went through: as PyTorch ran it, or with ops it refused and the recorder repaired."""
        import dataclasses

        refused = [op.index for op in list(self.ops())[self._ops_before.pop(id(opt), 0):] if getattr(op, "error", None)]
        pending = self._pending.pop(id(opt), [])
        if pending:
            self.refused_ops.extend(refused)
        for m in pending:
            i = self.mismatches.index(m)
            self.mismatches[i] = dataclasses.replace(m, stepped=not refused)

    def facts(self) -> Resume | None:
        if not (self.restored or self.mismatches):
            return None
        return Resume(tuple(self.restored), tuple(self._named(c) for c in self.casts), tuple(self.mismatches),
                      tuple(self.refused_ops))

    def _named(self, cast: StateCast) -> StateCast:
        import dataclasses

        held = self._params.get(id(cast))
        p = held[1]() if held is not None else None
        name = self.names().get(id(p)) if p is not None else None
        return dataclasses.replace(cast, param=name) if name else cast
