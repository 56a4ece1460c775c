"""Typed errors. The CLI maps each type to one line on stderr and an exit code."""

from __future__ import annotations


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line for stderr or a report: its first line, cut at `limit`."""
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0].strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def memory_words(exc: BaseException, limit: int = 200) -> str:
    """An out-of-memory error as one line that keeps the size it asked for: the CPU allocator's
    C++ location ("[enforce fail at alloc_cpu.cpp:124] err == 0.") goes, and the line is cut at
    `limit` (cut at 120 with it, the size was lost)."""
    line = first_line(exc, 10_000)
    if line.startswith("[enforce fail at "):
        line = line.partition("] ")[2]
        line = line.partition(". ")[2] or line  # the failed condition ("err == 0.")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def is_gpu_out_of_memory(exc: BaseException) -> bool:
    """torch.OutOfMemoryError: what an accelerator's allocator raises (by name: torch not imported)."""
    return type(exc).__name__ == "OutOfMemoryError"


def is_out_of_memory(exc: BaseException) -> bool:
    """Python's MemoryError, torch's OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError."""
    if isinstance(exc, MemoryError) or is_gpu_out_of_memory(exc):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text)


class DoctorError(Exception):
    """Base of the errors the tool raises on purpose."""

    exit_code = 3


class UsageError(DoctorError):
    """Bad options: unknown format, unknown rule code, batch size 0 …"""

    exit_code = 2


class InputError(DoctorError):
    """A model, dataset or preprocess function that cannot be loaded or used."""

    exit_code = 2


class RemoteCodeError(InputError):
    """The model needs code from its repository and --trust-remote-code was not given."""


class PickleRefusedError(InputError):
    """The model's only weights are pickled (pytorch_model.bin)."""


class StopScript(BaseException):
    """Raised into the script to stop it once the traced steps are done.

    A BaseException, so the script's own `except Exception:` does not swallow it."""
