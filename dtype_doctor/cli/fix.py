"""`dtype-doctor fix MODEL DATASET`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dtype_doctor.cli import options as o

EXAMPLES = """
Examples:

\b
  dtype-doctor fix fixtures/demo/model fixtures/demo/data

\b
  dtype-doctor fix ./model ./images --preprocess prep.py:preprocess \\
      --write-patch fix.patch

\b
  dtype-doctor fix ./model ./data --script train.py --strategy autocast \\
      --write-patch fix.patch && git apply fix.patch
"""
Strategy = Annotated[str, typer.Option("--strategy", metavar="NAME", help="auto|cast-inputs|half-model|autocast|to-device|fp32-trainable.")]
UnsafeFixes = Annotated[bool, typer.Option("--unsafe-fixes", help="Let auto use fixes that change weight precision (half-model).")]
Force = Annotated[bool, typer.Option("--force", help="Overwrite an existing --write-patch file; apply half-model despite fp16 overflow evidence.")]
WritePatch = Annotated[Optional[Path], typer.Option("--write-patch", metavar="PATH", help="Write the verified fix as a unified diff (git apply) to PATH.")]
Script = Annotated[Optional[Path], typer.Option("--script", metavar="FILE.py", help="Your pipeline script: the patch changes it (from_pretrained dtype=, autocast, batch casts).")]
MaxRounds = Annotated[int, typer.Option("--max-rounds", metavar="N", help="Apply / re-trace rounds before giving up.")]


def fix_command(
    model: o.Model,
    dataset: o.Dataset,
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
    format: o.Format = None,
    output: o.Output = None,
    fail_on: o.FailOn = "error",
    select: o.Select = None,
    ignore: o.Ignore = None,
    trust_remote_code: o.TrustRemoteCode = False,
    allow_pickle: o.AllowPickle = False,
    debug: o.Debug = False,
) -> None:
    """Fix the mismatches in memory, re-run the trace to verify, and show what the fix costs.

    Exit 0 when the re-run trace is clean at --fail-on, 1 when not.
    """
    from dtype_doctor.cli.output import check_format, emit, exit_code, progress, quiet_libraries
    from dtype_doctor.pipeline import fix

    check_format(format)
    exit_code(None, fail_on)
    if max_rounds < 1:
        from dtype_doctor.errors import UsageError

        raise UsageError(f"--max-rounds must be at least 1, not {max_rounds}")
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
    if write_patch and not (outcome.patch and outcome.patch.path):
        print(f"dtype-doctor: no patch written: {outcome.patch_skipped or outcome.detail}", file=sys.stderr)
        if outcome.patch_skipped:
            raise typer.Exit(1)  # a patch was asked for and the fix could not be written as one
    if fail_on == "never":
        raise typer.Exit(0)
    raise typer.Exit(0 if outcome.verified else 1)
