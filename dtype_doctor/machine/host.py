"""This machine's memory as the process sees it: what it can still allocate, and what bounds it.

Nothing here imports torch.
"""

from __future__ import annotations

import os
import resource


def gib(n: float) -> str:
    """A byte count for a message: MiB below one GiB."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def available() -> tuple[int, str]:
    """(bytes this process can still allocate, what bounds it)."""
    avail, what = _mem_available(), "available memory"
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        room = soft - _address_space_used()
        if room < avail:
            avail, what = max(room, 0), f"room under its address-space limit (RLIMIT_AS {gib(soft)})"
    return avail, what


def _mem_available() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _address_space_used() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
