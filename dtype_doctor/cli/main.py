"""The `dtype-doctor` command: a thin shell over dtype_doctor.pipeline and friends.

Commands raise typed errors; `run()` turns each into one line on stderr and an exit
code (the traceback only with --debug). Nothing here imports torch at import time.
"""

from __future__ import annotations

import sys

import typer

from dtype_doctor import __version__
from dtype_doctor.cli.rules import rule_command, rules_command
from dtype_doctor.cli.scan import EXAMPLES as SCAN_EXAMPLES
from dtype_doctor.cli.scan import scan_command

app = typer.Typer(
    name="dtype-doctor",
    help="Find every dtype and device mismatch in a PyTorch / Hugging Face pipeline in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("scan", epilog=SCAN_EXAMPLES)(scan_command)
app.command("rule")(rule_command)
app.command("rules")(rules_command)


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


def run(argv: list[str] | None = None) -> None:
    """Entry point: exit codes 0 clean, 1 findings, 2 bad usage or input, 3 internal error."""
    import click

    from dtype_doctor.errors import DoctorError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        # Without standalone mode, click returns the code of a typer.Exit instead of raising.
        returned = app(args=args, prog_name="dtype-doctor", standalone_mode=False)
        code = returned if isinstance(returned, int) else 0
    except typer.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort:
        code = _fail("aborted", 130)
    except click.UsageError as exc:
        code = _fail(exc.format_message().replace("\n", " "), 2)
    except DoctorError as exc:
        if debug:
            raise
        code = _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, exc.exit_code)
    except KeyboardInterrupt:
        code = _fail("interrupted", 130)
    except Exception as exc:  # noqa: BLE001 - last line of the error table
        if debug:
            raise
        code = _fail(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} (re-run with --debug for the traceback)", 3)
    sys.exit(code or 0)


if __name__ == "__main__":
    run()
