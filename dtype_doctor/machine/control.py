"""The user's code under the doctor's control: preprocess functions, scripts.

Inside `user_code(label, timeout)`:
- the user's prints go to stderr, so stdout carries the report only (`--format json` parses);
- `sys.exit()` (SystemExit) is bad input, exit 2, named with the user's file and line;
- Ctrl-C (KeyboardInterrupt) is exit 130, with where the user's code was;
- after `timeout` seconds (SIGALRM, main thread only) the code is stopped where it is and the
  error names that place. 0 or None: no limit. `time_left()` says how long until then, so a wait
  that can say more than "stopped" (a DataLoader worker that delivers nothing) ends just before.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

from dtype_doctor.records.errors import DoctorError, InputError, StopScript

DEFAULT_TIMEOUT = 300.0  # seconds; --timeout 0 turns the limit off
_active = threading.local()


class Interrupted(DoctorError):
    """Ctrl-C while the user's code ran."""

    exit_code = 130


class UserCodeTimeout(BaseException):
    """Raised into the user's code when its time is up. A BaseException, so the user's own
    `except Exception:` does not swallow it. `waiting`: what the code was waiting on, when that
    is known ("waiting on DataLoader worker process 1 (pid 12, fork), at data.py:9 in __getitem__")."""

    def __init__(self, waiting: str = "") -> None:
        super().__init__(waiting)
        self.waiting = waiting


def stop_waiting(waiting: str) -> None:
    """Stop the running block now, as its time limit is about to, saying what it was waiting on (the limit is
    spent: the timer is cancelled, so it cannot fire again while the stop is reported)."""
    disarm()
    raise UserCodeTimeout(waiting)


def check_timeout(timeout: float | None) -> None:
    from dtype_doctor.records.errors import UsageError

    if timeout is not None and not timeout >= 0:  # NaN too
        raise UsageError(f"--timeout must be 0 (no limit) or a number of seconds, not {timeout}")


def where(tb: Any = None, frame: Any = None) -> str:
    """' at prep.py:12': the innermost frame of the user's own files, from a traceback or a frame."""
    from dtype_doctor.machine.user_code import display_path, is_user_file

    found = None
    if tb is not None:
        import traceback

        for f, line in traceback.walk_tb(tb):
            if is_user_file(f.f_code.co_filename):
                found = (f.f_code.co_filename, line)
    while found is None and frame is not None:
        if is_user_file(frame.f_code.co_filename):
            found = (frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return f" at {display_path(found[0])}:{found[1]}" if found else ""


def disarm() -> None:
    """End the time limit of the running block early (a script's traced steps are done)."""
    _active.deadline = None
    if getattr(_active, "timer", False) and hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0)


def time_left() -> tuple[float, float] | None:
    """(seconds until this thread's running block is stopped, its --timeout); None where nothing will stop it
    (no limit, the limit disarmed, another thread than the one the limit watches)."""
    deadline = getattr(_active, "deadline", None)
    return None if deadline is None else (deadline[0] - time.monotonic(), deadline[1])


class HorizonReached(StopScript):
    """The script ran the seconds it was given past its traced steps without failing: stopped there."""


def run_on_for(seconds: float) -> None:
    """After the traced steps: let the script go on `seconds` more, then stop it (HorizonReached),
    which is how far it was asked to run, not a time-out."""
    if getattr(_active, "timer", False) and hasattr(signal, "setitimer"):
        _active.horizon = True
        signal.setitimer(signal.ITIMER_REAL, float(seconds))


def _exit_words(code: object) -> str:
    return "sys.exit()" if code is None else f"sys.exit({code!r})"


@contextlib.contextmanager
def user_code(label: str, timeout: float | None = DEFAULT_TIMEOUT) -> Iterator[None]:
    """Run the block as the user's code named `label` ("preprocess function prep.py:fn")."""
    if getattr(_active, "on", False):  # nested: the outer block already controls it
        yield
        return
    timer = bool(timeout) and threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    stopped: list[str] = []

    def on_alarm(_signum: int, frame: Any) -> None:
        if getattr(_active, "horizon", False):
            raise HorizonReached()
        stopped.append(where(frame=frame))
        raise UserCodeTimeout

    old_handler = signal.signal(signal.SIGALRM, on_alarm) if timer else None
    _active.on, _active.timer = True, timer
    try:
        if timer:
            _active.deadline = (time.monotonic() + float(timeout), float(timeout))  # type: ignore[arg-type]
            signal.setitimer(signal.ITIMER_REAL, float(timeout))  # type: ignore[arg-type]
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except UserCodeTimeout as exc:
        at = stopped[0] if stopped else where(exc.__traceback__)
        waiting = f", {exc.waiting}" if exc.waiting else ""
        raise InputError(f"{label} ran past --timeout {timeout:g} s and was stopped{at or ' in it'}{waiting}"
                         " (raise --timeout, or 0 for no limit)") from None
    except SystemExit as exc:
        raise InputError(f"{label} called {_exit_words(exc.code)}{where(exc.__traceback__)}; "
                         "it must return, not exit") from None
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted in {label}{where(exc.__traceback__)}") from None
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
        _active.on = _active.timer = _active.horizon = False
        _active.deadline = None
        sys.stdout.flush()
