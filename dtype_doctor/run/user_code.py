"""Which files are the user's own: not the standard library, not installed packages, not the doctor."""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

from dtype_doctor.records import SourceLoc


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    import dtype_doctor

    roots = {os.path.realpath(p) for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(key))}
    roots.add(os.path.realpath(os.path.dirname(dtype_doctor.__file__)))
    return tuple(sorted(r + os.sep for r in roots))


@lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    return not path.startswith(_library_roots()) and "site-packages" not in path


def display_path(filename: str) -> str:
    """The file relative to the working directory when it lies below it, else as given."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def user_site(skip: int = 1) -> SourceLoc | None:
    """The nearest frame of the user's own code above the caller (`skip` frames up), as a SourceLoc."""
    frame = sys._getframe(skip + 1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return SourceLoc(display_path(frame.f_code.co_filename), frame.f_lineno)
        frame = frame.f_back
    return None
