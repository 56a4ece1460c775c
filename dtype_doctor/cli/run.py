"""`dtype-doctor run [options] -- python SCRIPT.py ARGS`: the user's own script, unmodified."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dtype_doctor.cli import options as o

EXAMPLES = """
Examples:

\b
  dtype-doctor run -- python train.py --epochs 3

\b
  dtype-doctor run --steps 2 -o report.json -o results.sarif -- python -m mypkg.train

\b
  dtype-doctor run --keep-running -- python train.py

\b
  dtype-doctor run --simulate --device cuda --gpu t4 -- python train.py
"""
SCRIPT = "Your script"
Command = Annotated[Optional[list[str]], typer.Argument(metavar="COMMAND", help="After --: python FILE ARGS, python -m MODULE ARGS, accelerate launch [...] FILE ARGS or torchrun [...] FILE ARGS, as you run your script.", show_default=False)]
Steps = Annotated[int, typer.Option("--steps", metavar="N", rich_help_panel=SCRIPT, help="Steps traced: calls of the model, each with its loss, backward and optimizer step.")]
KeepRunning = Annotated[bool, typer.Option("--keep-running", rich_help_panel=SCRIPT, help="Let the script go on after the traced steps (unwatched) instead of stopping it.")]
Simulate = Annotated[bool, typer.Option("--simulate", rich_help_panel=o.MACHINE, help="The script sees a CUDA machine: .cuda(), .to('cuda'), device='cuda' give tensors without data, autocast('cuda') applies CUDA's lists; no GPU needed.")]
Device = Annotated[str, typer.Option("--device", metavar="DEVICE", rich_help_panel=o.MACHINE, help="auto|cpu|cuda|cuda:N — the machine the script sees (cuda without a GPU needs --simulate; cpu hides a GPU).")]
KeepWrites = Annotated[Optional[Path], typer.Option("--keep-writes", metavar="DIR", rich_help_panel=SCRIPT, help="With --simulate: keep the files the script wrote (held back from your file system) under DIR.", show_default=False)]

SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}


@o.flat(omit=("device_map", "max_memory"), override={"simulate": Simulate, "device": Device})
def run_command(*, command: Command = None, steps: Steps = 1, keep_running: KeepRunning = False, keep_writes: KeepWrites = None,
                machine: o.Machine,
                findings: o.Findings, outputs: o.Outputs, general: o.General) -> None:
    """Run your script unmodified, trace the first step(s) of the model it calls, report every mismatch.

    The script runs in this process with its own sys.argv, __main__ and working directory.
    Its output goes to stderr; stdout carries the report. Exit codes as scan; with
    --keep-running and no findings, the script's own exit code. With --simulate the step is
    traced on tensors without data; where the script asks one for a value (loss.item()), it
    gets a stated stand-in and goes on, and what it writes is held back from your files.
    """
    from dtype_doctor.cli.reporting import Reporting, check_values, import_libraries
    from dtype_doctor.run.command import parse_command
    from dtype_doctor.machine.user_code import user_frame
    from dtype_doctor.run.launchers import split_launcher
    from dtype_doctor.run.runner import run_script

    check_values(None, machine, None, findings)
    check_command(command, "run")
    words, launch = split_launcher(list(command or []), machine.gpus)
    script = parse_command(words)
    options = o.run_options(machine, findings, general, steps=steps, keep_running=keep_running, launch=launch,
                            keep_writes=str(keep_writes.resolve()) if keep_writes is not None else None)
    options.validated()
    reporting = Reporting.prepare(_resolved(outputs), findings, reads=(script.target,) if script.kind == "file" else (),
                                  config=general.config)
    stdout = sys.stdout  # the script's prints go to stderr while it runs; the report does not
    shown: list[Any] = []

    def on_report(report: Any) -> None:
        import contextlib

        with contextlib.redirect_stdout(stdout):
            shown.append(reporting.finish(report))

    import_libraries(outputs)  # the one stage said: the script's own output follows on stderr
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
        from dtype_doctor.machine.wording import as_device
        from dtype_doctor.records.errors import first_line

        said = first_line(error)
        if options.placement.simulated:  # the stand-in said as the device it stands for
            from dtype_doctor.machine.placement import CUDA0

            wanted = str(options.placement.device or "cuda")
            said = as_device(said, CUDA0 if wanted == "cuda" else wanted) or said
        print(f"dtype-doctor: {script.display} raised {type(error).__name__}{user_frame(error)}: {said}", file=sys.stderr)
    report = shown[-1] if shown else result.report
    code = reporting.exit_code(report)
    if code == 0 and keep_running and not findings.write_baseline:
        code = result.outcome.exit_code
    raise typer.Exit(code)


def _resolved(outputs: o.Outputs) -> o.Outputs:
    """Output paths of the invoking directory, whatever the script does with its own."""
    import dataclasses
    from pathlib import Path

    from dtype_doctor.cli.output import format_prefix
    from dtype_doctor.report import FORMATS

    def absolute(spec: str) -> str:
        if spec == "-":
            return spec
        prefixed = format_prefix(spec, FORMATS)
        if prefixed is not None:
            return f"{prefixed[0]}:{Path(prefixed[1]).resolve()}"
        return str(Path(spec).resolve())

    return dataclasses.replace(
        outputs,
        output=[absolute(s) for s in outputs.output] if outputs.output else outputs.output,
        plot=outputs.plot.resolve() if outputs.plot is not None else None,
    )


def check_command(command: list[str] | None, name: str) -> None:
    """An unknown option before `--` lands in COMMAND (options there are the script's): name it as one."""
    first = (command or [""])[0]
    if first.startswith("-") and first not in ("-m", "--"):
        from dtype_doctor.records.errors import UsageError

        raise UsageError(f"no such option: {first} (see 'dtype-doctor {name} --help'); the script and its arguments go after --")
