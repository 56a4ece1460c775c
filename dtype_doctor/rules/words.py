"""How a list of names is said, by the rules' messages and the strategies' words alike."""

from __future__ import annotations

from typing import Sequence


def listed(items: Sequence[str], most: int = 3) -> str:
    """'a', 'a and b', 'a, b and c', 'a, b, c and 2 more'."""
    items = list(dict.fromkeys(items))
    if len(items) > most:
        items = [*items[:most], f"{len(items) - most} more"]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
