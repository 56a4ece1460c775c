"""Run a ScriptCommand in this process the way `python` would run it.

sys.argv, sys.path[0], `__main__` and the working directory are what the script would see
under plain python; sys.exit() and exceptions end the script, not the doctor. Everything
is restored afterwards. The script's stdout goes to stderr while it runs: stdout carries
the report only, so `--format json` stays parseable.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from dataclasses import dataclass, field

from dtype_doctor.run.command import ScriptCommand


@dataclass(frozen=True)
class ScriptOutcome:
    """How the script ended: its exit code as python would give it, and the exception if one ended it."""

    exit_code: int
    error: BaseException | None = field(default=None, compare=False)
    stopped: bool = False  # the doctor stopped it after the traced steps


class StopScript(BaseException):
    """Raised into the script to stop it once the traced steps are done.

    A BaseException, so the script's own `except Exception:` does not swallow it."""


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, as python does
    return 1


def launch(command: ScriptCommand) -> ScriptOutcome:
    if command.kind == "module":
        _check_module(command.target)
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            if command.kind == "file":
                sys.argv = [command.argv0 or command.target, *command.args]
                sys.path.insert(0, os.path.dirname(os.path.realpath(command.target)))
                _run_file(command.target)
            else:
                sys.argv = [command.target, *command.args]  # runpy puts the module's file in argv[0]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        return ScriptOutcome(0)
    except StopScript:
        return ScriptOutcome(0, stopped=True)
    except SystemExit as exc:
        return ScriptOutcome(_exit_code(exc))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - the script's own failure is reported, not the doctor's
        return ScriptOutcome(1, error=exc)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        sys.stdout.flush()
        if os.getcwd() != saved_cwd:
            os.chdir(saved_cwd)


def _check_module(name: str) -> None:
    import importlib.util

    from dtype_doctor.errors import InputError

    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.pop(0)
    if not found:
        raise InputError(f"python -m {name}: no module named {name!r}")


def _run_file(path: str) -> None:
    """Execute a file as `__main__` the way `python FILE` does.

    runpy.run_path would overwrite sys.argv[0] with the absolute path; python keeps it as
    the user wrote it, and scripts print or parse it."""
    import builtins
    import importlib.machinery
    import types

    with open(path, "rb") as f:  # compile() reads the coding cookie from bytes
        code = compile(f.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path, __cached__=None, __package__=None, __spec__=None, __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
