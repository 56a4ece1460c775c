"""`os.scandir` over the simulated file system: the user's directory and the script's writes, as one.

`os.walk`, `glob`, `pathlib`'s `glob`/`rglob` and `shutil.copytree` list a directory with
`os.scandir`, whose entries come from the kernel; under `--simulate` a directory holds the user's
files (less those the script removed) and the files the script wrote into scratch (machine/disk.py).
The entries here answer as `os.DirEntry` does, each through the overlay's `stat`: `path` is the
path the script named (never the scratch copy), `is_dir()` / `is_file()` / `is_symlink()` read the
file the script would open.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable, Iterator


class Entry:
    """One name in a merged listing, with os.DirEntry's methods."""

    def __init__(self, parent: Any, name: Any, stat_of: Callable[..., os.stat_result]) -> None:
        self.name = name
        self.path = os.path.join(parent, name)
        self._stat_of = stat_of

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        return self._stat_of(self.path, follow_symlinks=follow_symlinks)

    def _mode(self, follow_symlinks: bool) -> int:
        try:
            return self.stat(follow_symlinks=follow_symlinks).st_mode
        except OSError:
            return 0

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return stat.S_ISDIR(self._mode(follow_symlinks))

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return stat.S_ISREG(self._mode(follow_symlinks))

    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self._mode(False))

    def is_junction(self) -> bool:
        return False

    def inode(self) -> int:
        return self.stat(follow_symlinks=False).st_ino

    def __fspath__(self) -> Any:
        return self.path

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r}>"


class Listing:
    """What `os.scandir(path)` returns: an iterator of entries, and a context manager."""

    def __init__(self, parent: Any, names: list[Any], stat_of: Callable[..., os.stat_result]) -> None:
        self._entries: Iterator[Entry] = iter([Entry(parent, n, stat_of) for n in names])

    def __iter__(self) -> "Listing":
        return self

    def __next__(self) -> Entry:
        return next(self._entries)

    def close(self) -> None:
        self._entries = iter(())

    def __enter__(self) -> "Listing":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def merged(path: Any, names: list[Any], stat_of: Callable[..., os.stat_result]) -> Listing:
    """The listing of `path` (as the script named it; "." when it named none) whose names are `names`."""
    return Listing(path, names, stat_of)  # os.scandir(".") names its entries "./x", as os.path.join does
