"""Run a ScriptCommand in this process the way `python` would run it.

sys.argv, sys.path[0], `__main__` and the working directory are what the script would see
under plain python; sys.exit() and exceptions end the script, not the doctor. Everything
is restored afterwards. The script's stdout goes to stderr while it runs: stdout carries
the report only, so `--format json` stays parseable.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from dtype_doctor.run.command import ScriptCommand
from dtype_doctor.records.errors import StopScript
from dtype_doctor.machine.control import UserCodeTimeout


@dataclass(frozen=True)
class ScriptOutcome:
    """How the script ended: its exit code as python would give it, and the exception if one ended it."""

    exit_code: int
    error: BaseException | None = field(default=None, compare=False)
    stopped: bool = False  # the doctor stopped it after the traced steps
    stop: BaseException | None = field(default=None, compare=False)  # the StopScript that stopped it

    @property
    def ended_by(self) -> BaseException | None:
        """What ended the script early: its own exception, or the doctor's stop."""
        return self.error if self.error is not None else self.stop


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, as python does
    return 1


def launch(command: ScriptCommand, sources: Mapping[str, str] | None = None) -> ScriptOutcome:
    """Run the script; `sources` (absolute path → text) replaces the text of those files as they are
    run or imported, so a patched script runs without being written to disk."""
    if command.kind == "module":
        _check_module(command.target)
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    patched = {os.path.realpath(k): v for k, v in (sources or {}).items()}
    modules_before = set(sys.modules)
    try:
        with contextlib.redirect_stdout(sys.stderr), _patched_imports(patched):
            if command.kind == "file":
                sys.argv = [command.argv0 or command.target, *command.args]
                sys.path.insert(0, os.path.dirname(os.path.realpath(command.target)))
                _run_file(command.target, patched.get(os.path.realpath(command.target)))
            else:
                sys.argv = [command.target, *command.args]  # runpy puts the module's file in argv[0]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        return ScriptOutcome(0)
    except StopScript as stop:
        return ScriptOutcome(0, stopped=True, stop=stop)
    except SystemExit as exc:
        return ScriptOutcome(_exit_code(exc))
    except (KeyboardInterrupt, UserCodeTimeout):
        raise  # the doctor's to report (machine.control), not the script's failure
    except BaseException as exc:  # noqa: BLE001 - the script's own failure is reported, not the doctor's
        return ScriptOutcome(1, error=exc)
    finally:
        _forget_user_modules(modules_before)
        _reset_library_state()
        sys.argv = saved_argv
        sys.path[:] = saved_path
        sys.stdout.flush()
        if os.getcwd() != saved_cwd:
            os.chdir(saved_cwd)


def _forget_user_modules(before: set[str]) -> None:
    """The user's own modules the script imported are dropped, so the next run imports them afresh
    (as a new python process would, and with their patched text when a fix is verified)."""
    from dtype_doctor.machine.user_code import is_user_file

    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if name != "__main__" and is_user_file(getattr(module, "__file__", None) or ""):
            del sys.modules[name]


def _reset_library_state() -> None:
    """Process-wide state a library kept for the script (accelerate's AcceleratorState, a singleton
    that refuses a second mixed_precision): the next run starts without it, as a new python would."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    try:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    except Exception:  # noqa: BLE001 - another accelerate version: its state stays as it was
        pass


def _check_module(name: str) -> None:
    import importlib.util

    from dtype_doctor.records.errors import InputError

    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.pop(0)
    if not found:
        raise InputError(f"python -m {name}: no module named {name!r}")


def _run_file(path: str, text: str | None = None) -> None:
    """Execute a file as `__main__` the way `python FILE` does (`text`: the file's patched text).

    runpy.run_path would overwrite sys.argv[0] with the absolute path; python keeps it as
    the user wrote it, and scripts print or parse it."""
    import builtins
    import importlib.machinery
    import types

    if text is not None:
        code = compile(text, path, "exec")
    else:
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


@contextlib.contextmanager
def _patched_imports(patched: Mapping[str, str]) -> Iterator[None]:
    """While the script runs, importing one of the `patched` files runs its patched text."""
    if not patched:
        yield
        return
    finder = _PatchedFinder(patched)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _PatchedFinder:
    def __init__(self, patched: Mapping[str, str]) -> None:
        self.patched = patched

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else None
        if origin not in self.patched:
            return None
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_PatchedLoader(fullname, spec.origin, self.patched[origin]),
                                                      submodule_search_locations=spec.submodule_search_locations)


class _PatchedLoader(importlib.machinery.SourceFileLoader):
    """A source loader that reads the patched text and never reads or writes bytecode caches."""

    def __init__(self, fullname: str, path: str, text: str) -> None:
        super().__init__(fullname, path)
        self.text = text

    def get_data(self, path: str) -> bytes:
        if os.path.realpath(path) == os.path.realpath(self.path):
            return self.text.encode("utf-8")
        raise OSError(f"{path}: no bytecode for a patched file")

    def set_data(self, path: str, data: bytes, *, _mode: int = 0o666) -> None:  # noqa: ARG002 - no cache of patched text
        return None
