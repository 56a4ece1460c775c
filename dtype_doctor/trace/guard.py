"""What a traced step may change in the user's model, and how it is put back.

`diagnose()` promises the model as it was: parameters (values, identity, requires_grad),
gradients, buffers, training flags, every module's attributes and the config. A forward can
change each of them, and the ones that matter in practice:

- buffers updated in place (BatchNorm statistics, counters, caches): copied before, copied back;
- buffers and attributes *replaced* (transformers' dynamic RoPE re-registers `inv_freq` and
  moves `max_seq_len_cached` past the cached length): each module's `__dict__`, `_buffers`,
  `_parameters` and `_modules` are restored to the objects they held;
- hooks and other entries *added* to a dict the module holds (transformers 5 installs its
  output-capturing forward hooks on the first call, then marks the model hooked in `__dict__`;
  restoring the mark alone would leave the hooks, and the next call would install them twice):
  each plain dict in a module's `__dict__` gets its entries back;
- parameters written in place (`self.weight.data.mul_(2)`, a `copy_` into a weight), on the
  way to an exception or not: parameters are large, so nothing is copied up front; a dispatch
  mode sees every op that writes into a tensor and copies a parameter the first time an op is
  about to write into its storage (copy on first write), and the copy is written back after;
- the config's attributes (`problem_type`, which a classification head decides from the first
  labels it sees): numerics.config_kept;
- parameters whose data a library replaces, with the state it keeps on them (bitsandbytes'
  CPU kernel packs a 4-bit weight on its first eval forward without grad, on CPUs with
  avx512_bf16: `weight.data` becomes the packed layout and its QuantState is rewritten in
  place): each parameter's data and attributes, and those attributes' own fields, are put back.

Not restored: tensors the forward writes to outside the model (a global cache, the inputs),
and parameters written through a storage the dispatcher never sees (a C extension writing raw
memory). A trace on moved or fake copies of the state (another device, --simulate) never
touches the parameters, and runs without the write guard.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dtype_doctor.numerics import config_kept
from dtype_doctor.trace.opfacts import facts


def _with_storage(t: torch.Tensor) -> list[torch.Tensor]:
    """`t`, or the inner tensors of a wrapper subclass (torchao's MX training weights), which has no storage of its own."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [inner for n in names for inner in _with_storage(getattr(t, n))]
    return [t]


class WriteGuard(TorchDispatchMode):
    """Copies a watched tensor's values the first time an op is about to write into its storage.

    On its own it is a dispatch mode (compare's timed steps). Under a trace the recorder's dispatch
    mode calls `before()` itself (preserved(..., mode=False)): one Python mode per op, not two.
    """

    def __init__(self, watched: list[torch.Tensor]) -> None:
        super().__init__()
        self._by_storage = {t.untyped_storage().data_ptr(): t for w in watched for t in _with_storage(w) if t.numel()}
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # storage → (tensor, its values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        self.before(func, args, kwargs)
        return func(*args, **kwargs)

    def before(self, func: Any, args: tuple, kwargs: dict) -> None:
        """An op `func(*args, **kwargs)` is about to run: save what it would write of the watched tensors."""
        written = facts(func).written
        if written:
            schema = func._schema.arguments
            for i in written:
                target = args[i] if i < len(args) else kwargs.get(schema[i].name)
                for t in target if isinstance(target, (list, tuple)) else (target,):
                    if isinstance(t, torch.Tensor):
                        self._before_write(t)

    def _before_write(self, t: torch.Tensor) -> None:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, functional)
            return
        watched = self._by_storage.get(ptr)
        if watched is not None and ptr not in self.saved:
            with torch.no_grad():
                self.saved[ptr] = (watched, watched.detach().clone())

    def restore(self) -> None:
        with torch.no_grad():
            for watched, values in self.saved.values():
                watched.detach().copy_(values)
        self.saved.clear()


@contextlib.contextmanager
def preserved(model: torch.nn.Module, *, train: bool, guard_writes: bool = True, mode: bool = True) -> Iterator[WriteGuard | None]:
    """The block runs a step on `model`; on the way out the model is as it was (see the module doc).

    `guard_writes`: watch the parameters for in-place writes (off where the step runs on copies).
    `mode`: the write guard is a dispatch mode over the block; False: it is only yielded, for a
    dispatch mode of the caller's to call its `before()` (the recorder's, trace/engine.py).
    """
    modules = list(model.modules())
    flags = [(m, m.training) for m in modules]
    attrs = [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules), set(m._non_persistent_buffers_set),
              _dict_contents(m)) for m in modules]
    params = list(model.parameters())
    grads = [(p, p.grad, p.requires_grad) for p in params]
    # Buffers are small; a forward may update them in place (BatchNorm stats, counters, caches).
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    kept = [_ParamState(p) for p in params if p.__dict__]  # plain parameters carry no state of a library's
    guard = WriteGuard(params) if guard_writes and params else None
    try:
        if train:
            for p in params:
                p.grad = None
        model.train(train)  # always: a model's own train() override may set more than the flags
        with config_kept(model), (guard if guard is not None and mode else contextlib.nullcontext()):
            yield guard
    finally:
        for m, saved, parameters, own_buffers, children, non_persistent, contents in attrs:
            _refill(m._parameters, parameters)
            _refill(m._buffers, own_buffers)
            _refill(m._modules, children)
            for held, entries in contents:
                _refill(held, entries)
            if m._non_persistent_buffers_set != non_persistent:
                m._non_persistent_buffers_set.clear()
                m._non_persistent_buffers_set.update(non_persistent)
            now = m.__dict__
            if now.keys() != saved.keys():
                for key in now.keys() - saved.keys():
                    del now[key]
            now.update(saved)
        for m, flag in flags:
            if m.training != flag:  # Module.__setattr__ is slow: a step seldom changes a flag
                m.training = flag
        for state in kept:
            state.restore()
        if guard is not None:
            guard.restore()
        with torch.no_grad():
            for p, g, requires_grad in grads:
                p.grad = g
                p.requires_grad_(requires_grad)
            for b, saved_values in buffers:
                b.copy_(saved_values)


_OWN_DICTS = frozenset({"_parameters", "_buffers", "_modules"})


def _dict_contents(m: torch.nn.Module) -> list[tuple[dict, dict]]:
    """Each plain dict a module holds (its hook tables, a cache) with a copy of its entries: a
    step may add to them in place (transformers installs its output-capturing forward hooks on
    the first call and marks the model as hooked; the mark goes with __dict__, the hooks would stay)."""
    return [(v, dict(v)) for k, v in m.__dict__.items() if type(v) in (dict, OrderedDict) and k not in _OWN_DICTS]


class _ParamState:
    """A parameter's data object and attributes (bitsandbytes' Params4bit: quant_state, ...), and the fields
    of those attributes that are plain objects (a QuantState), as they were before the step."""

    def __init__(self, p: torch.Tensor) -> None:
        self.p = p
        self.data = p.data
        self.attrs = dict(p.__dict__)
        self.fields = [(v, dict(v.__dict__)) for v in self.attrs.values() if _plain_object(v)]

    def restore(self) -> None:
        p = self.p
        now = p.data
        if now.dtype != self.data.dtype or now.shape != self.data.shape or _storage(now) != _storage(self.data):
            p.data = self.data
        for obj, fields in self.fields:
            if obj.__dict__.keys() != fields.keys() or any(obj.__dict__[k] is not v for k, v in fields.items()):
                obj.__dict__.clear()
                obj.__dict__.update(fields)
        if p.__dict__.keys() != self.attrs.keys() or any(p.__dict__[k] is not v for k, v in self.attrs.items()):
            p.__dict__.clear()
            p.__dict__.update(self.attrs)


def _plain_object(v: Any) -> bool:
    return hasattr(v, "__dict__") and not isinstance(v, (torch.Tensor, torch.nn.Module, type)) and not callable(v)


def _storage(t: torch.Tensor) -> Any:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without storage
        return id(t)


def _refill(target: dict, saved: dict) -> None:
    """`target` holds exactly `saved`'s entries again, in their order, the dict object kept."""
    if target.keys() == saved.keys() and all(target[k] is v for k, v in saved.items()):
        return
    target.clear()
    target.update(saved)
