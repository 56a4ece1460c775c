"""`dtype-doctor fix MODEL DATASET`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dtype_doctor.cli import options as o
from dtype_doctor.cli.run import Steps
from dtype_doctor.fix import strategies

EXAMPLES = """
Examples:

\b
  dtype-doctor fix fixtures/demo/model fixtures/demo/data

\b
  dtype-doctor fix --run --write-patch fix.patch -- python train.py --epochs 3

\b
  dtype-doctor fix ./model ./data --script train.py --strategy autocast \\
      --write-patch fix.patch && git apply fix.patch
"""
Strategy = Annotated[str, typer.Option("--strategy", metavar="NAME", help=strategies.help_text() + ".")]
UnsafeFixes = Annotated[bool, typer.Option("--unsafe-fixes", help="Let auto use fixes that change weight precision (half-model).")]
Force = Annotated[bool, typer.Option("--force", help="Overwrite an existing --write-patch file; apply half-model despite fp16 overflow evidence.")]
WritePatch = Annotated[Optional[Path], typer.Option("--write-patch", metavar="PATH", help="Write the verified fix as a unified diff (git apply) to PATH.")]
Script = Annotated[Optional[Path], typer.Option("--script", metavar="FILE.py", help="Your pipeline script: the patch changes it (from_pretrained dtype=, autocast, batch casts).")]
MaxRounds = Annotated[int, typer.Option("--max-rounds", metavar="N", help="Apply / re-trace rounds before giving up.")]
Run = Annotated[bool, typer.Option("--run", help="Fix your own script instead of MODEL DATASET: trace its first step as `run` does; the patch edits your files.")]
# With --run, MODEL and DATASET give way to the command after --: `fix --run -- python train.py ARGS`.
FixModel = Annotated[Optional[str], typer.Argument(metavar="MODEL", help="Model directory (config.json + weights) or a hub id in the local cache.", show_default=False)]
FixDataset = Annotated[Optional[str], typer.Argument(metavar="DATASET", help="save_to_disk directory, data file/folder (csv, json, jsonl, parquet, arrow, images) or a cached hub id.", show_default=False)]
Command = Annotated[Optional[list[str]], typer.Argument(metavar="COMMAND", help="With --run, after --: python FILE ARGS or python -m MODULE ARGS, as you run your script.", show_default=False)]


def fix_command(
    model: FixModel = None,
    dataset: FixDataset = None,
    command: Command = None,
    run: Run = False,
    strategy: Strategy = "auto",
    unsafe_fixes: UnsafeFixes = False,
    force: Force = False,
    write_patch: WritePatch = None,
    script: Script = None,
    max_rounds: MaxRounds = 5,
    split: o.Split = None,
    batch_size: o.BatchSize = 2,
    preprocess: o.Preprocess = None,
    preprocess_mode: o.PreprocessMode = "map",
    dataset_format: o.DatasetFormat = "torch",
    collator: o.Collator = "auto",
    device: o.Device = "auto",
    dtype: o.Dtype = "auto",
    autocast: o.Autocast = "off",
    train: o.Train = False,
    simulate: o.Simulate = False,
    gpu: o.Gpu = None,
    steps: Steps = 1,
    format: o.Format = None,
    output: o.Output = None,
    fail_on: o.FailOn = "error",
    select: o.Select = None,
    ignore: o.Ignore = None,
    trust_remote_code: o.TrustRemoteCode = False,
    allow_pickle: o.AllowPickle = False,
    load_in_4bit: o.LoadIn4bit = False,
    load_in_8bit: o.LoadIn8bit = False,
    bnb_compute_dtype: o.BnbComputeDtype = None,
    bnb_quant_type: o.BnbQuantType = "nf4",
    timeout: o.Timeout = o.DEFAULT_TIMEOUT,
    debug: o.Debug = False,
    config: o.Config = None,  # noqa: ARG001 - read by cli/config.py before parsing
) -> None:
    """Fix the mismatches in memory, re-run the trace to verify, and show what the fix costs.

    With --run, your own script is traced as `dtype-doctor run` traces it, the fix is written
    as a patch against your files, and the patched script is run again to verify it.
    Exit 0 when the re-run trace is clean at --fail-on, 1 when not.
    """
    from dtype_doctor.cli.output import check_format, check_outputs, emit, exit_code, progress, quiet_libraries
    from dtype_doctor.errors import UsageError

    check_format(format)
    exit_code(None, fail_on)
    if max_rounds < 1:
        raise UsageError(f"--max-rounds must be at least 1, not {max_rounds}")
    check_outputs(locals(), reads=_script_files([w for w in (model, dataset, *(command or [])) if w is not None]) if run else ())
    if run:
        report = _fix_script([w for w in (model, dataset, *(command or [])) if w is not None], locals())
    else:
        from dtype_doctor.pipeline import fix

        if model is None or dataset is None:
            raise UsageError(f"Missing argument '{'MODEL' if model is None else 'DATASET'}' (or --run -- python SCRIPT.py to fix your own script)")
        if command:
            raise UsageError(f"Got unexpected extra argument ({command[0]}); a script to fix goes after --run --")
        opts = o.scan_options(locals())
        quiet_libraries()
        report = fix(
            model, dataset, opts, strategy=strategy, fail_on=fail_on if fail_on != "never" else "error",
            unsafe_fixes=unsafe_fixes, force=force, max_rounds=max_rounds,
            write_patch=str(write_patch) if write_patch else None, script=str(script) if script else None,
            progress=progress(),
        )
    emit(report, format, output, fail_on)
    outcome = report.fix
    assert outcome is not None
    patch = outcome.patch
    if write_patch and not (patch and patch.path):
        print(f"dtype-doctor: no patch written: {outcome.patch_skipped or outcome.detail}", file=sys.stderr)
        if outcome.patch_skipped:
            raise typer.Exit(1)  # a patch was asked for and the fix could not be written as one
    if patch and patch.path and patch.unwritten:
        print(f"dtype-doctor: {patch.path} leaves out: {'; '.join(patch.unwritten)}", file=sys.stderr)
        raise typer.Exit(1)  # a patch without every verified change is not the fix
    if fail_on == "never":
        raise typer.Exit(0)
    raise typer.Exit(0 if outcome.verified else 1)


def _fix_script(words: list[str], values: dict) -> object:
    """`fix --run -- python SCRIPT ARGS`: trace the script's step, fix it, patch the user's files, verify."""
    from dtype_doctor.cli.output import quiet_libraries
    from dtype_doctor.cli.run import check_command
    from dtype_doctor.errors import UsageError
    from dtype_doctor.run.command import parse_command
    from dtype_doctor.run.fix import EditBrokeScript, fix_script
    from dtype_doctor.run.runner import RunOptions

    # Options that shape a MODEL DATASET batch mean nothing for a script, which builds its own.
    for name, flag, default in (("script", "--script", None), ("preprocess", "--preprocess", None), ("split", "--split", None),
                                ("batch_size", "--batch-size", 2), ("dtype", "--dtype", "auto"), ("autocast", "--autocast", "off"),
                                ("train", "--train", False)):
        if values[name] != default:
            raise UsageError(f"{flag} is for MODEL DATASET; with --run the script's own code decides it (its patch edits the script itself)")
    check_command(words, "fix")
    command = parse_command(words)
    options = RunOptions(steps=values["steps"], select=o.split_codes(values["select"]), ignore=o.split_codes(values["ignore"]),
                         simulate=values["simulate"], device=values["device"], gpu=values["gpu"], timeout=values["timeout"])
    options.validate()
    quiet_libraries()
    fail_on = values["fail_on"]
    write_patch = values["write_patch"]
    try:
        return fix_script(
            command, options, strategy=values["strategy"], fail_on=fail_on if fail_on != "never" else "error",
            unsafe_fixes=values["unsafe_fixes"], force=values["force"], max_rounds=values["max_rounds"],
            write_patch=write_patch.resolve() if write_patch else None,
        )
    except EditBrokeScript as exc:
        print(exc.diff, file=sys.stderr, end="")  # the doctor's edit, above the line that says it broke the script (exit 3)
        raise


def _script_files(words: list[str] | None) -> tuple[str, ...]:
    """The script file of `python FILE ARGS` (after --), which fix --run reads and patches."""
    from dtype_doctor.run.command import parse_command

    try:
        command = parse_command(list(words or []))
    except Exception:  # noqa: BLE001 - a bad command is reported where it is parsed
        return ()
    return (command.target,) if command.kind == "file" else ()
