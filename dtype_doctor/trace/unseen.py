"""The doctor's module hooks, unseen by the script's own copies of its model.

The recorder's hooks are its bound methods, so a module's hook dicts hold the recorder (and its
weak references) while a step is traced: the script's `torch.save(model, f)` would fail half
written, `copy.deepcopy(model)` would copy the recorder. The hooks stay in torch's own dicts (the
script's hook handles, and the order hooks run in, are untouched), and while any is attached a
reducer for `OrderedDict` in `copyreg.dispatch_table` writes those dicts without the doctor's
entries. `pickle`, `torch.save` and `copy.deepcopy` all consult that table by exact type before an
object's own `__reduce_ex__`, and a module's hook dicts are always plain `OrderedDict`s that torch
made, so no subclass's `__getstate__` can bypass it; the bytes are those of the plain script.
Parameter hooks need nothing: a Parameter pickles and deep-copies without its hooks.
"""

from __future__ import annotations

import contextlib
import copyreg
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator

_HIDDEN: dict[int, tuple["weakref.ref[OrderedDict]", set[int]]] = {}  # id(hook dict) → (the dict, the doctor's keys)
_BEFORE: list[Any] = []  # the table's entry for OrderedDict before the doctor's, while it is installed


def hook_module(mod: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> list[Any]:
    """`pre` and `post` as `mod`'s forward hooks (with kwargs; `post` always called), hidden from copies."""
    handles = [mod.register_forward_pre_hook(pre, with_kwargs=True), mod.register_forward_hook(post, with_kwargs=True, always_call=True)]
    for h in handles:
        for ref in (h.hooks_dict_ref, *h.extra_dict_ref):
            d = ref()
            if d is not None:
                entry = _HIDDEN.get(id(d))
                if entry is None or entry[0]() is not d:
                    entry = _HIDDEN[id(d)] = (weakref.ref(d), set())
                entry[1].add(h.id)
    if _HIDDEN and not _BEFORE:
        _BEFORE.append(copyreg.dispatch_table.get(OrderedDict))
        copyreg.dispatch_table[OrderedDict] = _reduced
    return handles


def unhook(handles: Iterable[Any]) -> None:
    """Remove `handles` (from hook_module); the reducer goes with the last of them."""
    for h in handles:
        h.remove()
        for ref in (h.hooks_dict_ref, *h.extra_dict_ref):
            d = ref()
            entry = _HIDDEN.get(id(d)) if d is not None else None
            if entry is not None:
                entry[1].discard(h.id)
                if not entry[1]:
                    del _HIDDEN[id(d)]
    for key in [k for k, (ref, _) in _HIDDEN.items() if ref() is None]:
        del _HIDDEN[key]
    if not _HIDDEN and _BEFORE:
        before = _BEFORE.pop()
        if before is None:
            copyreg.dispatch_table.pop(OrderedDict, None)
        else:
            copyreg.dispatch_table[OrderedDict] = before


def _reduced(d: OrderedDict) -> tuple:
    """What `OrderedDict.__reduce__` gives, less the doctor's entries when `d` is a hook dict holding them."""
    entry = _HIDDEN.get(id(d))
    ours = entry[1] if entry is not None and entry[0]() is d else ()
    if not ours and _BEFORE and _BEFORE[0] is not None:
        return _BEFORE[0](d)
    state = getattr(d, "__dict__", None) or None
    return (OrderedDict, (), state, None, iter([(k, v) for k, v in d.items() if k not in ours]))




def hook_dicts(modules: Iterable[Any], handles: Iterable[Any]) -> list[tuple[OrderedDict, frozenset[int]]]:
    """The forward hook dicts of `modules` that hold hooks of `handles` (from hook_module), each with the
    ids of those hooks in it: what `hooks_aside` takes out."""
    ids = {h.id for h in handles}
    found = []
    for mod in modules:
        for d in (mod._forward_pre_hooks, mod._forward_hooks):
            if d and not ids.isdisjoint(d):
                found.append((d, frozenset(ids.intersection(d))))
    return found


@contextlib.contextmanager
def hooks_aside(dicts: list[tuple[OrderedDict, frozenset[int]]]) -> Iterator[None]:
    """The block runs without the doctor's hooks in `dicts` (from hook_dicts): taken out, so a module with no
    other hook takes torch's fast path, and put back in their places after, behind the script's hooks that
    were before them and ahead of those after (and of any the block registered)."""
    saved = [(d, ours, list(d.items())) for d, ours in dicts]
    for d, ours, items in saved:
        if len(items) == len(ours):
            d.clear()  # only the doctor's: the common case
        else:
            for key in ours:
                d.pop(key, None)
    try:
        yield
    finally:
        for d, ours, items in saved:
            if not d:
                d.update(items)
                continue
            now = dict(d)  # the script's hooks, as the block left them
            d.clear()
            for key, hook in items:
                if key in ours:
                    d[key] = hook
                elif key in now:
                    d[key] = now.pop(key)
            d.update(now)
