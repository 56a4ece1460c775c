"""`dtype-doctor run [options] -- python SCRIPT.py ARGS`: the user's own script, unmodified."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from dtype_doctor.cli import options as o

EXAMPLES = """
Examples:

\b
  dtype-doctor run -- python train.py --epochs 3

\b
  dtype-doctor run --steps 2 --format json -o report.json -- python -m mypkg.train

\b
  dtype-doctor run --keep-running -- python train.py
"""
Command = Annotated[Optional[list[str]], typer.Argument(metavar="COMMAND", help="After --: python FILE ARGS or python -m MODULE ARGS, as you run your script.", show_default=False)]
Steps = Annotated[int, typer.Option("--steps", metavar="N", help="Steps traced: calls of the model, each with its loss, backward and optimizer step.")]
KeepRunning = Annotated[bool, typer.Option("--keep-running", help="Let the script go on after the traced steps (unwatched) instead of stopping it.")]

SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def run_command(
    command: Command = None,
    steps: Steps = 1,
    keep_running: KeepRunning = False,
    format: o.Format = None,
    output: o.Output = None,
    fail_on: o.FailOn = "error",
    select: o.Select = None,
    ignore: o.Ignore = None,
    debug: o.Debug = False,
) -> None:
    """Run your script unmodified, trace the first step(s) of the model it calls, report every mismatch.

    The script runs in this process with its own sys.argv, __main__ and working directory.
    Its output goes to stderr; stdout carries the report. Exit codes as scan; with
    --keep-running and no findings, the script's own exit code.
    """
    from dtype_doctor.cli.output import check_format, emit, exit_code, quiet_libraries
    from dtype_doctor.run.command import parse_command
    from dtype_doctor.run.runner import run_script, user_frame

    check_format(format)
    exit_code(None, fail_on)
    script = parse_command(command or [])
    quiet_libraries()
    stdout = sys.stdout  # the script's prints go to stderr while it runs; the report does not

    def on_report(report: object) -> None:
        import contextlib

        with contextlib.redirect_stdout(stdout):
            emit(report, format, output, fail_on)

    result = run_script(script, steps=steps, keep_running=keep_running, select=o.split_codes(select),
                        ignore=o.split_codes(ignore), on_report=on_report)
    error = result.outcome.error
    if error is not None:
        from dtype_doctor.errors import first_line

        print(f"dtype-doctor: {script.display} raised {type(error).__name__}{user_frame(error)}: {first_line(error)}",
              file=sys.stderr)
    code = exit_code(result.report, fail_on)
    if code == 0 and keep_running:
        code = result.outcome.exit_code
    raise typer.Exit(code)
