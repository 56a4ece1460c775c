"""Shared work of identical layers in a simulated trace (docs/report.md, `coverage.shared_layers`).

The layers of a big decoder are copies of one signature (Llama-3 405B: 126 of them). A layer is
shared with an earlier one, its template, only where the two are provably the same call:

- the same class, the same parameters and buffers (names, dtypes, shapes, devices, requires_grad),
  the same non-tensor attributes in every submodule (a sliding-window layer is not a global one),
  `layer_idx` aside only where no forward reads it other than as a call's argument;
- the same inputs (dtype, shape, device, layout, requires_grad of each tensor, every other
  argument by value or, for objects such as a cache, by identity), grad mode, training mode and
  autocast state;
- a template traced in full that raised nothing, needed no repair and assumed no condition.

A shared layer still runs (its outputs are the next layer's inputs), but op by op with nothing
recorded; its ops and its submodules' calls are the template's, renamed to it, and its outputs
carry the origins the template's had. Any layer that differs in any of these is traced.

Where no write guard watches the step, a shared layer runs with the recorder's dispatch mode off
(a Python dispatch mode costs every op of the layer, 0.5 s of a 405B scan's forward, measured):
its ops go straight to the fake mode. Should one of them raise after all, the step stops there as
PyTorch stops it, the trace's failure names the layer, and nothing of the template is copied for it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Hashable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode, _push_mode

from dtype_doctor.numerics import tensors_in
from dtype_doctor.records import ModuleCall, OpCall, TensorMeta
from dtype_doctor.trace.module_hooks import autocast_state
from dtype_doctor.trace.provenance import Provenance

if TYPE_CHECKING:
    from dtype_doctor.trace.recorder import Recorder

# Attributes of a module that are its machinery, not its configuration.
_MACHINERY = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_state_dict_hooks",
                        "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
                        "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                        "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                        "_backward_pre_hooks", "_is_full_backward_hook", "__dict__"})
_PLAIN = (int, float, str, bool, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclass(frozen=True, slots=True)
class _Template:
    name: str
    ops: tuple[OpCall, ...]
    modules: tuple[ModuleCall, ...]
    input_origins: tuple[str | None, ...]
    output_origins: tuple[str | None, ...]


def _value_key(v: Any, depth: int = 0) -> Hashable:
    """A non-tensor value by value where it is plain, else by identity (one config, one cache)."""
    if isinstance(v, _PLAIN):
        return (type(v).__name__, v)
    if isinstance(v, torch.Tensor):
        return ("tensor", v.dtype, tuple(v.shape), str(v.device), v.layout, v.requires_grad)
    if depth < 4 and isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value_key(x, depth + 1) for x in v))
    if depth < 4 and isinstance(v, dict):
        return ("dict", tuple((str(k), _value_key(x, depth + 1)) for k, x in v.items()))
    if depth < 4 and isinstance(v, functools.partial):  # one per layer (an activation's approximate="tanh")
        return ("partial", id(v.func), _value_key(v.args, depth + 1), _value_key(v.keywords, depth + 1))
    return ("object", type(v).__qualname__, id(v))


def _reads_layer_idx(mod: torch.nn.Module) -> bool:
    """Whether any forward in `mod` reads `self.layer_idx` other than as a call's argument (a cache
    update takes it; `if self.layer_idx % 2` or `layer_types[self.layer_idx]` decides by it)."""
    return any(_forward_reads_layer_idx(type(sub)) for sub in mod.modules())


@functools.lru_cache(maxsize=None)
def _forward_reads_layer_idx(cls: type) -> bool:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return True  # unreadable: not provably unread
    passed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            passed.update(id(a) for a in node.args)
            passed.update(id(k.value) for k in node.keywords)
    return any(isinstance(node, ast.Attribute) and node.attr == "layer_idx" and id(node) not in passed for node in ast.walk(tree))


def static_signature(mod: torch.nn.Module) -> Hashable | None:
    """What a layer is beside its state and inputs: its class and every submodule's non-tensor
    attributes; None where it cannot be shared (a forward reads its index)."""
    if _reads_layer_idx(mod):
        return None
    attrs = tuple(
        (n, type(sub).__qualname__, tuple(sorted((k, _value_key(v)) for k, v in vars(sub).items()
                                                 if k not in _MACHINERY and k != "layer_idx")))
        for n, sub in mod.named_modules()
    )
    return (type(mod).__module__, type(mod).__qualname__, attrs)


def state_signature(mod: torch.nn.Module) -> Hashable:
    """Its parameters and buffers as the call sees them (a functional call's state swapped in)."""
    params = tuple((n, p.dtype, tuple(p.shape), str(p.device), p.requires_grad, type(p).__name__)
                   for n, p in mod.named_parameters(remove_duplicate=False))
    buffers = tuple((n, b.dtype, tuple(b.shape), str(b.device), type(b).__name__)
                    for n, b in mod.named_buffers(remove_duplicate=False))
    return params, buffers


def decoder_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The items of the model's outermost ModuleLists of two or more: its repeated layers."""
    found: dict[str, torch.nn.Module] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1 and not any(name.startswith(f"{k}.") for k in found):
            for i, child in enumerate(mod):
                found[f"{name}.{i}" if name else str(i)] = child
    return found


class LayerSharing:
    """Hooks on the model's repeated layers that share an identical layer's trace with its template."""

    def __init__(self, rec: Recorder, model: torch.nn.Module) -> None:
        self.rec = rec
        self.layers = decoder_layers(model)
        self.static = {name: static_signature(m) for name, m in self.layers.items()}
        self.templates: dict[Hashable, _Template | None] = {}  # None: its template raised or was repaired
        self.shared: list[tuple[str, str]] = []  # (layer, the layer it shares the trace of)
        self._open: dict[int, tuple[str, Hashable, int, int, tuple[str | None, ...], _Template | None]] = {}
        self._handles: list[Any] = []
        self._names = {id(m): n for n, m in self.layers.items()}
        self._off: dict[int, tuple[Any, BaseException | None]] = {}  # the dispatch mode taken off for a shared layer

    def attach(self) -> "LayerSharing":
        for name, mod in self.layers.items():
            if self.static[name] is None:
                continue
            self._handles.append(mod.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._post, with_kwargs=True, always_call=True, prepend=True))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _origins(self, tensors: Any) -> tuple[str | None, ...]:
        prov_of = self.rec.prov.get
        return tuple((p.origin if (p := prov_of(t)) is not None else None) for t in tensors)

    def _pre(self, mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        rec = self.rec
        if rec.shared or id(mod) in self._open or rec.is_suspended:
            return
        name = self._names[id(mod)]
        amp = rec.amp.current() if rec.amp is not None else autocast_state()
        key = (self.static[name], state_signature(mod), _value_key(args), _value_key(kwargs), amp, torch.is_grad_enabled(), mod.training)
        template = self.templates.get(key)
        inputs = self._origins(tensors_in(args, kwargs))
        self._open[id(mod)] = (name, key, len(rec.ops), len(rec.modules), inputs, template)
        if template is not None:
            rec.shared = True
            self._mode_off(mod)

    def _mode_off(self, mod: torch.nn.Module) -> None:
        """The recorder's dispatch mode off while a shared layer runs, where it is the innermost mode
        and guards no writes (see the module doc)."""
        mode = _get_current_dispatch_mode()
        if self.rec.writes is None and mode is not None and getattr(mode, "rec", None) is self.rec:
            self._off[id(mod)] = (_pop_mode(), sys.exc_info()[1])

    def _mode_on(self, mod: torch.nn.Module) -> bool:
        """The mode back on after the layer; whether the layer raised while it was off."""
        off = self._off.pop(id(mod), None)
        if off is None:
            return False
        mode, handling = off
        _push_mode(mode)
        return sys.exc_info()[1] not in (None, handling)  # an always-called hook runs inside the layer's raise

    def _post(self, mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        raised = self._mode_on(mod)
        opened = self._open.pop(id(mod), None)
        if opened is None:
            return
        rec = self.rec
        name, key, op_start, mod_start, inputs, template = opened
        if raised:  # not the same call as its template after all: the trace's failure names it
            rec.shared = False
            self.templates[key] = None
            return
        outputs = tuple(tensors_in(output))
        if template is None:
            ops = tuple(rec.ops[op_start:])
            clean = not any(op.error or op.recovered or op.attr("assumed") is not None for op in ops)
            if key not in self.templates:
                self.templates[key] = (
                    _Template(name, ops, tuple(rec.modules[mod_start:]), inputs, self._origins(outputs)) if clean else None
                )
            return
        if not rec.shared:  # an op of the shared layer raised: it went on being traced from there
            self.templates[key] = None
            return
        rec.shared = False
        rename = _Renamer(template, name, inputs)
        del rec.modules[mod_start:]
        rec.modules.extend(rename.module(m) for m in template.modules)
        start = len(rec.ops)
        rec.ops.extend(rename.op(op, start + i) for i, op in enumerate(template.ops))
        for t, origin in zip(outputs, template.output_origins):
            if rec.prov.get(t) is None:
                rec.prov[t] = Provenance("activation", None, rename.text(origin))
        self.shared.append((name, template.name))


class _Renamer:
    """The template's records as the shared layer's: its names under the layer's, its inputs' origins the layer's."""

    def __init__(self, template: _Template, name: str, inputs: tuple[str | None, ...]) -> None:
        self._inputs = {a: b for a, b in zip(template.input_origins, inputs) if a is not None and a != b}
        self._name = re.compile(rf"(?<![\w.]){re.escape(template.name)}(?=$|\.)")
        self._to = name
        self._texts: dict[str, str] = {}
        self._tuples: dict[tuple[TensorMeta, ...], tuple[TensorMeta, ...]] = {}

    def text(self, s: str | None) -> str | None:
        if s is None:
            return None
        found = self._texts.get(s)
        if found is None:
            found = self._texts[s] = self._inputs[s] if s in self._inputs else self._name.sub(self._to, s)
        return found

    def metas(self, ms: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
        """A tuple of the template's metas as the layer's (the same few tuples recur op after op)."""
        found = self._tuples.get(ms)
        if found is None:
            found = self._tuples[ms] = tuple(
                TensorMeta(m.dtype, m.device, m.shape, m.role, self.text(m.name), self.text(m.origin)) for m in ms
            )
        return found

    def op(self, op: OpCall, index: int) -> OpCall:
        # The constructor, not dataclasses.replace: a 405B layer's few hundred ops, 125 times over.
        return OpCall(index, op.op, self.text(op.module) or "", op.module_type, self.metas(op.operands), self.metas(op.outputs),
                      op.phase, op.autocast, op.error, op.recovered, op.level, op.attrs, op.stats, op.operand_stats)

    def module(self, m: ModuleCall) -> ModuleCall:
        return replace(m, name=self.text(m.name) or "", inputs=self.metas(m.inputs), outputs=self.metas(m.outputs))


class SharedRuns:
    """The Recorder's run of one op of a shared layer (it inherits this method): the op runs as
    the target's kernel would make it, and nothing is recorded."""

    shared: bool = False
    predict: Any

    def shared_run(self, func: Any, args: tuple, kwargs: dict, run: Any = None) -> tuple[bool, Any]:
        """(True, the op's output), or (False, None) where it raised: the layer is not the same
        call as its template after all, and is traced from this op on."""
        try:
            out = run(args, kwargs) if run is not None else func(*args, **kwargs)
        except Exception:  # noqa: BLE001 - recorded by the caller, which runs it again
            self.shared = False
            return False, None
        made = getattr(self.predict, "as_made", None)
        return True, (made(func, args, kwargs, out) if made is not None else out)
