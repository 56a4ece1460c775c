"""`dtype-doctor run [options] -- python SCRIPT.py ARGS`: the user's own script, unmodified."""

from __future__ import annotations

import sys
from pathlib import Path
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

\b
  dtype-doctor run --simulate --device cuda --gpu t4 -- python train.py
"""
Command = Annotated[Optional[list[str]], typer.Argument(metavar="COMMAND", help="After --: python FILE ARGS, python -m MODULE ARGS, accelerate launch [...] FILE ARGS or torchrun [...] FILE ARGS, as you run your script.", show_default=False)]
Steps = Annotated[int, typer.Option("--steps", metavar="N", help="Steps traced: calls of the model, each with its loss, backward and optimizer step.")]
KeepRunning = Annotated[bool, typer.Option("--keep-running", help="Let the script go on after the traced steps (unwatched) instead of stopping it.")]
Simulate = Annotated[bool, typer.Option("--simulate", help="The script sees a CUDA machine: .cuda(), .to('cuda'), device='cuda' give tensors without data, autocast('cuda') applies CUDA's lists; no GPU needed.")]
KeepWrites = Annotated[Optional[Path], typer.Option("--keep-writes", metavar="DIR", help="With --simulate: keep the files the script wrote (held back from your file system) under DIR.", show_default=False)]
Device = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto|cpu|cuda|cuda:N — the machine the script sees (cuda without a GPU needs --simulate; cpu hides a GPU).")]

SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


def run_command(
    command: Command = None,
    steps: Steps = 1,
    keep_running: KeepRunning = False,
    simulate: Simulate = False,
    device: Device = "auto",
    gpu: o.Gpu = None,
    gpus: o.Gpus = 1,
    keep_writes: KeepWrites = None,
    format: o.Format = None,
    output: o.Output = None,
    fail_on: o.FailOn = "error",
    select: o.Select = None,
    ignore: o.Ignore = None,
    timeout: o.Timeout = o.DEFAULT_TIMEOUT,
    debug: o.Debug = False,
    config: o.Config = None,  # noqa: ARG001 - read by cli/config.py before parsing
) -> None:
    """Run your script unmodified, trace the first step(s) of the model it calls, report every mismatch.

    The script runs in this process with its own sys.argv, __main__ and working directory.
    Its output goes to stderr; stdout carries the report. Exit codes as scan; with
    --keep-running and no findings, the script's own exit code. With --simulate the step is
    traced on tensors without data; where the script asks one for a value (loss.item()),
    the simulation ends and the script is stopped.
    """
    from dtype_doctor.cli.output import check_format, check_outputs, emit, exit_code, quiet_libraries
    from dtype_doctor.run.command import parse_command
    from dtype_doctor.run.runner import RunOptions, run_script, user_frame

    check_format(format)
    exit_code(None, fail_on)
    check_command(command, "run")
    from dtype_doctor.run.launchers import split_launcher

    words, launch = split_launcher(list(command or []), gpus)
    script = parse_command(words)
    check_outputs(locals(), reads=(script.target,) if script.kind == "file" else ())
    options = RunOptions(steps=steps, keep_running=keep_running, select=o.split_codes(select), ignore=o.split_codes(ignore),
                         simulate=simulate, device=device, gpu=gpu, gpus=gpus, launch=launch, timeout=timeout,
                         keep_writes=str(keep_writes.resolve()) if keep_writes is not None else None)
    options.validate()
    output = output.resolve() if output is not None else None  # the invoking cwd's, whatever the script does with its own
    quiet_libraries()
    stdout = sys.stdout  # the script's prints go to stderr while it runs; the report does not

    def on_report(report: object) -> None:
        import contextlib

        with contextlib.redirect_stdout(stdout):
            emit(report, format, output, fail_on)

    result = run_script(script, options=options, on_report=on_report)
    if result.note:
        print(f"dtype-doctor: {result.note}", file=sys.stderr)
    held = result.report.trace.writes if result.report.trace is not None else None
    if held:
        where = f"kept under {keep_writes}" if keep_writes is not None else "dropped (--keep-writes DIR keeps them)"
        print(f"dtype-doctor: the script wrote {len(held)} file(s); the simulation held them back from your files, {where}",
              file=sys.stderr)
    error = result.outcome.error
    if error is not None:
        from dtype_doctor.errors import first_line

        print(f"dtype-doctor: {script.display} raised {type(error).__name__}{user_frame(error)}: {first_line(error)}",
              file=sys.stderr)
    code = exit_code(result.report, fail_on)
    if code == 0 and keep_running:
        code = result.outcome.exit_code
    raise typer.Exit(code)


def check_command(command: list[str] | None, name: str) -> None:
    """An unknown option before `--` lands in COMMAND (options there are the script's): name it as one."""
    first = (command or [""])[0]
    if first.startswith("-") and first not in ("-m", "--"):
        from dtype_doctor.errors import UsageError

        raise UsageError(f"no such option: {first} (see 'dtype-doctor {name} --help'); the script and its arguments go after --")
