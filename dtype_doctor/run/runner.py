"""`run_script()`: launch the user's script under a RunSession and return what was traced."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from dtype_doctor.errors import InputError, UsageError, first_line
from dtype_doctor.records import Report
from dtype_doctor.run.command import ScriptCommand, parse_command
from dtype_doctor.run.launch import ScriptOutcome, launch


@dataclass(frozen=True)
class RunResult:
    command: ScriptCommand
    report: Report
    outcome: ScriptOutcome
    steps: int  # steps traced (fewer than asked when the script called the model fewer times)


def run_script(
    command: ScriptCommand | list[str] | tuple[str, ...],
    *,
    steps: int = 1,
    keep_running: bool = False,
    select: Iterable[str] | str | None = None,
    ignore: Iterable[str] | str | None = None,
    on_report: Callable[[Report], None] | None = None,
) -> RunResult:
    """Run `python FILE ARGS` / `python -m MODULE ARGS` in this process and trace its first step(s).

    `on_report` is called with the report as soon as the traced steps are done, before the
    script goes on (keep_running) or is stopped.
    """
    from dtype_doctor.rules import parse_codes
    from dtype_doctor.run.session import RunSession

    if steps < 1:
        raise UsageError(f"--steps must be at least 1, not {steps}")
    parse_codes(select)
    parse_codes(ignore)
    if not isinstance(command, ScriptCommand):
        command = parse_command(list(command))
    with RunSession(steps=steps, keep_running=keep_running, select=select, ignore=ignore, on_report=on_report,
                    label=command.display) as session:
        outcome = launch(command)
        error = outcome.error
    if session.report is None:
        # The session ends the trace on the way out of the `with`; no model call means no report.
        if error is not None:
            where = user_frame(error)
            raise InputError(
                f"{command.display} raised {type(error).__name__} before calling a model{where}: {first_line(error)}"
            ) from error
        raise InputError(
            f"{command.display} ended (exit code {outcome.exit_code}) without calling a model "
            "(a torch.nn.Module with parameters)"
        )
    return RunResult(command, session.report, outcome, min(session.steps, steps))


def user_frame(error: BaseException) -> str:
    """' at train.py:27': the last frame of the traceback in the user's own files, or ''."""
    import traceback

    from dtype_doctor.run.user_code import display_path, is_user_file

    last = None
    for frame, line in traceback.walk_tb(error.__traceback__):
        if is_user_file(frame.f_code.co_filename):
            last = (frame.f_code.co_filename, line)
    return f" at {display_path(last[0])}:{last[1]}" if last else ""
