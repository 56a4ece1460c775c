"""Which files are the user's own: not the standard library, not installed packages, not the doctor."""

from __future__ import annotations

import os
import sys
import sysconfig
from functools import lru_cache
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType

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
    frame = first_user_frame(frames_above(skip + 1))
    return SourceLoc(display_path(frame.f_code.co_filename), frame.f_lineno) if frame else None


# The one frame walker: lineage, the CUDA simulation and the run read the stack through these.


def frames_above(n: int = 0) -> Iterator[FrameType]:
    """The stack from `n` frames above the function that calls this (0: that function), outward."""
    frame: FrameType | None = sys._getframe(n + 1)
    return _outward(frame)


def _outward(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


@lru_cache(maxsize=1)
def _tool_roots() -> tuple[str, ...]:
    import torch

    import dtype_doctor

    return tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, dtype_doctor))


def is_tool_file(filename: str) -> bool:
    """A file of the tool's own (torch, or dtype-doctor): a frame in one is never where the user
    (or a library the user called) asked for something."""
    return filename.startswith(_tool_roots())


def first_user_frame(frames: Iterable[FrameType]) -> FrameType | None:
    """The first of `frames` in the user's own files."""
    return next((f for f in frames if is_user_file(f.f_code.co_filename)), None)


def first_outside_tool(frames: Iterable[FrameType]) -> FrameType | None:
    """The first of `frames` outside torch and dtype-doctor: the user's code or a library's."""
    return next((f for f in frames if not is_tool_file(f.f_code.co_filename)), None)


def user_frame(error: BaseException) -> str:
    """' at train.py:27': the last frame of the traceback in the user's own files, or ''."""
    import traceback

    last = None
    for frame, line in traceback.walk_tb(error.__traceback__):
        if is_user_file(frame.f_code.co_filename):
            last = (frame.f_code.co_filename, line)
    return f" at {display_path(last[0])}:{last[1]}" if last else ""
