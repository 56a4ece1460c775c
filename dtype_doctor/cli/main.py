"""The `dtype-doctor` command: a thin shell over dtype_doctor.pipeline and friends.

Commands raise typed errors; `run()` turns each into one line on stderr and an exit
code (the traceback only with --debug). Nothing here imports torch at import time.
"""

from __future__ import annotations

import re
import sys

import typer

from dtype_doctor import __version__
from dtype_doctor.cli.compare import EXAMPLES as COMPARE_EXAMPLES
from dtype_doctor.cli.compare import compare_command
from dtype_doctor.cli.fix import EXAMPLES as FIX_EXAMPLES
from dtype_doctor.cli.fix import fix_command
from dtype_doctor.cli.help import EXIT_CODES, Command
from dtype_doctor.cli.init import EXAMPLES as INIT_EXAMPLES, init_command
from dtype_doctor.cli.rules import rule_command, rules_command
from dtype_doctor.cli.run import EXAMPLES as RUN_EXAMPLES
from dtype_doctor.cli.run import SETTINGS as RUN_SETTINGS
from dtype_doctor.cli.run import run_command
from dtype_doctor.cli.scan import EXAMPLES as SCAN_EXAMPLES
from dtype_doctor.cli.scan import scan_command

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
app.command("scan", epilog=SCAN_EXAMPLES + EXIT_CODES, cls=Command)(scan_command)
app.command("fix", epilog=FIX_EXAMPLES + EXIT_CODES, cls=Command)(fix_command)
app.command("compare", epilog=COMPARE_EXAMPLES + EXIT_CODES.replace(" nothing at or above --fail-on", " measured (whatever the rows show)"), cls=Command)(compare_command)
app.command("run", epilog=RUN_EXAMPLES + EXIT_CODES, cls=Command, context_settings=RUN_SETTINGS)(run_command)
app.command("rule", cls=Command)(rule_command)
app.command("rules", cls=Command)(rules_command)
app.command("init", epilog=INIT_EXAMPLES, cls=Command)(init_command)


def _version(value: bool) -> None:
    if value:
        print(f"dtype-doctor {__version__}")
        raise typer.Exit()


@app.callback()
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
    from dtype_doctor.cli.config import COMMANDS, KEYED_ARGUMENTS, default_map

    if not args or args[0] not in COMMANDS or any(a in ("--help", "-h") for a in args):
        return None
    group = typer.main.get_command(app)
    params: dict[str, dict[str, str]] = {}
    for name in COMMANDS:
        kinds = {}
        for p in group.commands[name].params:  # type: ignore[attr-defined]
            kind = getattr(p, "param_type_name", "")
            if kind == "option":
                kinds[p.name] = "multiple" if getattr(p, "multiple", False) else "option"
            elif kind == "argument" and p.name in KEYED_ARGUMENTS and (name, p.name) != ("fix", "command"):
                kinds[p.name] = "argument"
        params[name] = kinds
    return default_map(args, params)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(argv: list[str] | None = None) -> None:
    """Entry point: exit codes 0 clean, 1 findings, 2 bad usage or input, 3 internal error.

    Every error is one line on stderr; with --debug the traceback comes first, the exit code
    stays the same."""
    import traceback

    from dtype_doctor.errors import DoctorError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    exit_types = (typer.Exit, *_click_exceptions("Exit"))
    abort_types = (typer.Abort, *_click_exceptions("Abort"))
    no_args_help = _click_exceptions("NoArgsIsHelpError")
    usage_types = _click_exceptions("UsageError")
    click_error_types = _click_exceptions("ClickException")
    try:
        # Without standalone mode, click returns the code of a typer.Exit instead of raising.
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
    except DoctorError as exc:
        if debug:
            traceback.print_exc()
        code = _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - last line of the error table
        if debug:
            traceback.print_exc()
        first = str(exc).splitlines()[0] if str(exc) else ""
        hint = "" if debug else " (re-run with --debug for the traceback)"
        code = _fail(f"internal error: {type(exc).__name__}: {first}{hint}", 3)
    sys.exit(code or 0)


if __name__ == "__main__":
    run()
