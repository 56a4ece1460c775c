"""`WeakIdMap`: values keyed by a tensor's identity, dropped when the tensor dies.

The recorder looks a tensor up several times per op (its provenance, whether its values were
measured); torch's `WeakIdKeyDictionary` builds a `WeakIdRef` (a new weak reference) for every
lookup, which made those lookups a large share of the trace's own cost. Here a lookup is one
dict access by `id()` and one call of the stored weak reference, which tells a live tensor from
a dead one whose id was reused; the weak reference's callback removes a dead tensor's entry.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class WeakIdMap(Generic[V]):
    """A mapping from objects (by identity, weakly held) to values."""

    __slots__ = ("_data", "_me", "__weakref__")

    def __init__(self) -> None:
        self._data: dict[int, tuple[weakref.ref, V]] = {}
        self._me = weakref.ref(self)  # what each entry's callback holds: the map may die first

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._data.get(id(key))
        if entry is not None and entry[0]() is key:
            return entry[1]
        return default

    def __contains__(self, key: Any) -> bool:
        entry = self._data.get(id(key))
        return entry is not None and entry[0]() is key

    def __setitem__(self, key: Any, value: V) -> None:
        k = id(key)
        entry = self._data.get(k)
        if entry is not None and entry[0]() is key:
            self._data[k] = (entry[0], value)
            return
        self._data[k] = (weakref.ref(key, _remover(self._me, k)), value)

    def pop(self, key: Any, default: Any = None) -> Any:
        k = id(key)
        entry = self._data.get(k)
        if entry is not None and entry[0]() is key:
            del self._data[k]
            return entry[1]
        return default

    def update_values(self, fn: Any) -> None:
        """Replace every live entry's value with `fn(value)`."""
        for k, (ref, value) in list(self._data.items()):
            if ref() is not None:
                self._data[k] = (ref, fn(value))

    def __len__(self) -> int:
        return len(self._data)


def _remover(owner: "weakref.ref[WeakIdMap[Any]]", k: int) -> Any:
    def remove(ref: weakref.ref) -> None:
        m = owner()
        if m is not None:
            entry = m._data.get(k)
            if entry is not None and entry[0] is ref:  # not a newer object that reused the id
                del m._data[k]

    return remove
