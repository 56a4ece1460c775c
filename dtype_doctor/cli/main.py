"""The `dtype-doctor` command: a thin shell over dtype_doctor.pipeline and friends.

Commands raise typed errors; `run()` turns each into one line on stderr and an exit
code (the traceback only with --debug). Nothing here imports torch at import time.
"""

from __future__ import annotations

import re
import sys

import typer

from dtype_doctor import __version__
from dtype_doctor.cli.help import EXIT_CODES, Command


def _scan() -> tuple[object, dict]:
    from dtype_doctor.cli.scan import EXAMPLES, scan_command

    return scan_command, {"epilog": EXAMPLES + EXIT_CODES}


def _fix() -> tuple[object, dict]:
    from dtype_doctor.cli.fix import EXAMPLES, fix_command

    return fix_command, {"epilog": EXAMPLES + EXIT_CODES}


def _compare() -> tuple[object, dict]:
    from dtype_doctor.cli.compare import EXAMPLES, compare_command

    return compare_command, {"epilog": EXAMPLES + EXIT_CODES.replace(" nothing at or above --fail-on", " measured (whatever the rows show)")}


def _run() -> tuple[object, dict]:
    from dtype_doctor.cli.run import EXAMPLES, SETTINGS, run_command

    return run_command, {"epilog": EXAMPLES + EXIT_CODES, "context_settings": SETTINGS}


def _rule() -> tuple[object, dict]:
    from dtype_doctor.cli.rules import rule_command

    return rule_command, {}


def _rules() -> tuple[object, dict]:
    from dtype_doctor.cli.rules import rules_command

    return rules_command, {}


def _init() -> tuple[object, dict]:
    from dtype_doctor.cli.init import EXAMPLES, init_command

    return init_command, {"epilog": EXAMPLES}


# Each command: its line in `dtype-doctor --help`, and what loads it. A command's module (and the
# engines its options name) is imported only when that command runs or prints its own help, so
# `dtype-doctor --help` and an early error pay for Typer and the one command they need.
COMMANDS = {
    "scan": ("Trace one batch through MODEL and report every mismatch.", _scan),
    "fix": ("Fix the mismatches, re-run the trace to verify, write a patch.", _fix),
    "compare": ("Measure fp32, autocast and .half() on the batch: which to use.", _compare),
    "run": ("Run your script unmodified and report every mismatch of its step.", _run),
    "rule": ("Explain one rule: what it flags, why, an example, the fix.", _rule),
    "rules": ("List every rule with its code, name, severity and summary.", _rules),
    "init": ("Write the config, a pre-commit hook and a GitHub workflow.", _init),
}


def _listed() -> None:
    """A command not loaded: it is listed in the group's help, and never run (the one asked for is loaded)."""


def build_app(load: frozenset[str] | None = None) -> typer.Typer:
    """The CLI with the commands in `load` loaded (None: every one); the others only listed."""
    app = typer.Typer(
        name="dtype-doctor",
        help="Find every dtype and device mismatch in a PyTorch / Hugging Face pipeline in one pass.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
        epilog=EXIT_CODES,
    )
    for name, (short, loader) in COMMANDS.items():
        if load is None or name in load:
            command, settings = loader()
            app.command(name, short_help=short, cls=Command, **settings)(command)
        else:
            app.command(name, short_help=short, cls=Command)(_listed)
    app.callback()(_root)
    return app


def _asked(args: list[str]) -> frozenset[str]:
    """The command the arguments name (the first word that is not an option), if it is one of ours."""
    first = next((a for a in args if not a.startswith("-")), None)
    return frozenset({first}) if first in COMMANDS else frozenset()


def _version(value: bool) -> None:
    if value:
        print(f"dtype-doctor {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Find every dtype and device mismatch in a PyTorch / Hugging Face pipeline in one pass."""


def _fail(message: str, code: int) -> int:
    print(f"dtype-doctor: error: {message}", file=sys.stderr)
    return code


def _click_exceptions(name: str) -> tuple[type[BaseException], ...]:
    """`name` from click and from the copy of click that typer >= 0.16 vendors (typer._click).

    Typer raises its own copies, which are not subclasses of click's: catching only
    click.UsageError let an unknown option or a missing argument through as an internal error."""
    import importlib

    found: list[type[BaseException]] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def _config(args: list[str]) -> dict | None:
    """--config PATH (or [tool.dtype-doctor] in ./pyproject.toml) as click's default_map."""
    from dtype_doctor.cli.config import COMMANDS as CONFIGURED, KEYED_ARGUMENTS, default_map

    if not args or args[0] not in CONFIGURED or any(a in ("--help", "-h") for a in args):
        return None

    def parameters() -> dict[str, dict[str, str]]:
        group = typer.main.get_command(build_app(frozenset(CONFIGURED)))
        params: dict[str, dict[str, str]] = {}
        for name in CONFIGURED:
            kinds = {}
            for p in group.commands[name].params:  # type: ignore[attr-defined]
                kind = getattr(p, "param_type_name", "")
                if kind == "option":
                    kinds[p.name] = "multiple" if getattr(p, "multiple", False) else "option"
                elif kind == "argument" and p.name in KEYED_ARGUMENTS and (name, p.name) != ("fix", "command"):
                    kinds[p.name] = "argument"
            params[name] = kinds
        return params

    return default_map(args, parameters)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(argv: list[str] | None = None) -> None:
    """Entry point: exit codes 0 clean, 1 findings, 2 bad usage or input, 3 internal error.

    Every error is one line on stderr; with --debug the traceback comes first, the exit code
    stays the same."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    exit_types = (typer.Exit, *_click_exceptions("Exit"))
    abort_types = (typer.Abort, *_click_exceptions("Abort"))
    no_args_help = _click_exceptions("NoArgsIsHelpError")
    usage_types = _click_exceptions("UsageError")
    click_error_types = _click_exceptions("ClickException")
    try:
        # Without standalone mode, click returns the code of a typer.Exit instead of raising.
        app = build_app(_asked(args))
        returned = app(args=args, prog_name="dtype-doctor", standalone_mode=False, default_map=_config(args))
        code = returned if isinstance(returned, int) else 0
    except exit_types as exc:
        code = getattr(exc, "exit_code", 0)
    except abort_types:
        code = _fail("aborted", 130)
    except no_args_help as exc:
        # `dtype-doctor` alone: the help, on stderr (stdout stays for reports), usage exit code.
        print(exc.format_message(), file=sys.stderr)  # type: ignore[attr-defined]
        code = 2
    except usage_types as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = _one_line(exc.format_message())  # type: ignore[attr-defined]
        # click's "(Possible options: --batch-size)" said as every other near name is
        message = re.sub(r" \(Possible options?: ([^)]*)\)", lambda m: f"; did you mean {m.group(1)}?", message)
        code = _fail((message.rstrip(".") if hint else message) + hint, 2)
    except click_error_types as exc:
        code = _fail(_one_line(exc.format_message()), getattr(exc, "exit_code", 1) or 1)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - a DoctorError, else the last line of the error table
        code = _failed(exc, debug)
    sys.exit(code or 0)


def _failed(exc: Exception, debug: bool) -> int:
    """The one line and exit code of an error the command raised: a DoctorError's own, else an internal
    error (3). records.errors is imported here, not for --help: importing it imports every record module."""
    import traceback

    from dtype_doctor.records.errors import DoctorError

    if debug:
        traceback.print_exc()
    if isinstance(exc, DoctorError):
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
    first = str(exc).splitlines()[0] if str(exc) else ""
    hint = "" if debug else " (re-run with --debug for the traceback)"
    return _fail(f"internal error: {type(exc).__name__}: {first}{hint}", 3)


if __name__ == "__main__":
    run()
