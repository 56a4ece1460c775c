"""`dtype-doctor fix MODEL DATASET` and `dtype-doctor fix --run -- python SCRIPT.py ARGS`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dtype_doctor.cli import options as o
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
FIX = "Fix"
Strategy = Annotated[str, typer.Option("--strategy", metavar="NAME", rich_help_panel=FIX, help=strategies.help_text() + ".")]
UnsafeFixes = Annotated[bool, typer.Option("--unsafe-fixes", rich_help_panel=FIX, help="Let auto use fixes that change weight precision (half-model).")]
Force = Annotated[bool, typer.Option("--force", rich_help_panel=FIX, help="Overwrite an existing --write-patch file; apply half-model despite fp16 overflow evidence.")]
WritePatch = Annotated[Optional[Path], typer.Option("--write-patch", metavar="PATH", rich_help_panel=FIX, help="Write the verified fix as a unified diff (git apply) to PATH.")]
Script = Annotated[Optional[Path], typer.Option("--script", metavar="FILE.py", rich_help_panel=FIX, help="Your pipeline script: the patch changes it (from_pretrained dtype=, autocast, batch casts).")]
MaxRounds = Annotated[int, typer.Option("--max-rounds", metavar="N", rich_help_panel=FIX, help="Apply / re-trace rounds before giving up.")]
Run = Annotated[bool, typer.Option("--run", rich_help_panel=FIX, help="Fix your own script instead of MODEL DATASET: trace its first step as `run` does; the patch edits your files.")]
FixSteps = Annotated[int, typer.Option("--steps", metavar="N", rich_help_panel=FIX, help="With --run: steps traced, as `run --steps`.")]
Horizon = Annotated[Optional[float], typer.Option("--horizon", metavar="SECONDS", rich_help_panel=FIX, help="With --run: how long the patched script runs on past the traced step to verify it (default: to its end, through its evaluation and checkpoint code).", show_default=False)]
# With --run, MODEL and DATASET give way to the command after --: `fix --run -- python train.py ARGS`.
FixModel = Annotated[Optional[str], typer.Argument(metavar="MODEL", help="Model directory (config.json + weights) or a hub id in the local cache.", show_default=False)]
FixDataset = Annotated[Optional[str], typer.Argument(metavar="DATASET", help="save_to_disk directory, data file/folder (csv, json, jsonl, parquet, arrow, images) or a cached hub id.", show_default=False)]
Command = Annotated[Optional[list[str]], typer.Argument(metavar="COMMAND", help="With --run, after --: python FILE ARGS, python -m MODULE ARGS, accelerate launch [...] FILE ARGS or torchrun [...] FILE ARGS, as you run your script.", show_default=False)]


@dataclass(frozen=True)
class FixOptions:
    """How to fix: the strategy, how far it may go, where the patch goes."""

    strategy: Strategy = "auto"
    unsafe_fixes: UnsafeFixes = False
    force: Force = False
    write_patch: WritePatch = None
    script: Script = None
    max_rounds: MaxRounds = 5
    run: Run = False
    steps: FixSteps = 1
    horizon: Horizon = None

    def check(self) -> None:
        from dtype_doctor.cli import checks
        from dtype_doctor.records.errors import UsageError

        if self.max_rounds < 1:
            raise UsageError(f"--max-rounds must be at least 1, not {self.max_rounds}")
        if self.horizon is not None and not self.run:
            raise UsageError("--horizon is for --run: how long your patched script runs on past the traced step")
        checks.writable_file("--write-patch", self.write_patch)
        checks.user_file("--script", str(self.script) if self.script is not None else None)

    def engine(self, fail_on: str) -> Any:
        """The FixSettings every fix engine takes, checked (the strategy's name); `never` still fixes errors."""
        from dtype_doctor.fix.settings import FixSettings

        return FixSettings(self.strategy, fail_on if fail_on != "never" else "error", self.unsafe_fixes, self.force,
                           self.max_rounds).validated()


@o.flat(omit=("gpus", "device_map", "max_memory"))
def fix_command(model: FixModel = None, dataset: FixDataset = None, command: Command = None, *, prompt: o.Prompt = None,
                fix: FixOptions, batch: o.Batch, loading: o.Loading, machine: o.Machine, step: o.Step, findings: o.Findings,
                outputs: o.Outputs, general: o.General) -> None:
    """Fix the mismatches in memory, re-run the trace to verify, and show what the fix costs.

    With --run, your own script is traced as `dtype-doctor run` traces it, the fix is written
    as a patch against your files, and the patched script is run again to verify it.
    MODEL may be a diffusers pipeline folder (model_index.json): its components are cast in memory,
    the step re-traced, and the lines go into --script (before its pipeline's first call) or a new
    dtype_doctor_fix.py.
    Exit 0 when the re-run trace is clean at --fail-on, 1 when findings remain (a patch still holds
    every verified edit), 3 when an edit of the doctor's made your script raise.
    """
    from dtype_doctor.cli.reporting import (
        Reporting, check_model_and_dataset, check_pipeline_folder, import_libraries, libraries, pipeline_folder,
    )

    settings = fix.engine(findings.fail_on)  # the strategy checked here, once, before anything loads
    fix.check()
    words = [w for w in (model, dataset, *(command or [])) if w is not None]
    writes = (("--write-patch", fix.write_patch),)
    if fix.run:
        if prompt is not None:
            from dtype_doctor.records.errors import UsageError

            raise UsageError("--prompt is for a diffusers pipeline folder; with --run the script calls its pipeline itself")
        script, options = _check_script(words, fix, batch, loading, step, machine, findings, general)
        reporting = Reporting.prepare(outputs, findings, reads=(script.target,) if script.kind == "file" else (),
                                      writes=writes, config=general.config)
        from dtype_doctor.run.fix import EditBrokeScript, fix_script

        import_libraries(outputs)  # the script's own output follows on stderr
        try:
            report = fix_script(script, options, settings=settings,
                                write_patch=fix.write_patch.resolve() if fix.write_patch else None)
        except EditBrokeScript as exc:
            print(exc.diff, file=sys.stderr, end="")  # the doctor's edit, above the line that says it broke the script (exit 3)
            raise
    elif not command and pipeline_folder(model, dataset, prompt):
        assert model is not None
        options = check_pipeline_folder(model, dataset, batch, loading, machine, step, findings, general, fixing=True)
        reporting = Reporting.prepare(outputs, findings, writes=writes, model=model, dataset=dataset, script=fix.script,
                                      config=general.config)
        from dtype_doctor.cli.reporting import quiet_diffusers
        from dtype_doctor.integrations.diffusers_folder import fix_pipeline

        with libraries(outputs) as say:
            quiet_diffusers(outputs)
            report = fix_pipeline(model, dataset, options, prompt=prompt, settings=settings,
                                  write_patch=str(fix.write_patch) if fix.write_patch else None,
                                  script=str(fix.script) if fix.script else None, progress=say)
    else:
        model, dataset = _model_and_dataset(model, dataset, command)
        options = check_model_and_dataset(model, dataset, batch, loading, machine, step, findings, general)
        reporting = Reporting.prepare(outputs, findings, writes=writes, model=model, dataset=dataset,
                                      preprocess=batch.preprocess, script=fix.script, config=general.config)
        from dtype_doctor.pipeline import fix as fix_model

        with libraries(outputs) as say:
            report = fix_model(model, dataset, options, settings=settings,
                                  write_patch=str(fix.write_patch) if fix.write_patch else None,
                                  script=str(fix.script) if fix.script else None, progress=say)
    report = reporting.finish(report)
    raise typer.Exit(_exit_code(report, fix, findings.fail_on))


def _model_and_dataset(model: str | None, dataset: str | None, command: list[str] | None) -> tuple[str, str]:
    from dtype_doctor.records.errors import UsageError

    if model is None or dataset is None:
        raise UsageError(f"Missing argument '{'MODEL' if model is None else 'DATASET'}' (or --run -- python SCRIPT.py to fix your own script)")
    if command:
        raise UsageError(f"Got unexpected extra argument ({command[0]}); a script to fix goes after --run --")
    return model, dataset


def _exit_code(report: Any, fix: FixOptions, fail_on: str) -> int:
    """0 when the fix verified (or --fail-on never); 1 when not, or when an asked-for patch was not written whole."""
    outcome = report.fix
    assert outcome is not None
    patch = outcome.patch
    if fix.write_patch and not (patch and patch.path):
        print(f"dtype-doctor: no patch written: {outcome.patch_skipped or outcome.detail}", file=sys.stderr)
        if outcome.patch_skipped:
            return 1  # a patch was asked for and the fix could not be written as one
    if patch and patch.path and patch.unwritten:
        print(f"dtype-doctor: {patch.path} leaves out: {'; '.join(patch.unwritten)}", file=sys.stderr)
        return 1  # a patch without every verified change is not the fix
    if fail_on == "never":
        return 0
    return 0 if outcome.verified else 1


def _check_script(words: list[str], fix: FixOptions, batch: o.Batch, loading: o.Loading, step: o.Step,
                  machine: o.Machine, findings: o.Findings, general: o.General) -> tuple[Any, Any]:
    """`fix --run -- python SCRIPT ARGS`: the script command and its RunOptions, checked; the
    options that shape a MODEL DATASET batch refused (the script builds its own)."""
    import dataclasses

    from dtype_doctor.cli.reporting import check_values
    from dtype_doctor.cli.run import check_command
    from dtype_doctor.records.errors import UsageError
    from dtype_doctor.run.command import parse_command

    defaults = (("--script", fix.script, None), ("--preprocess", batch.preprocess, None), ("--split", batch.split, None),
                ("--batch-size", batch.batch_size, 2), ("--dtype", loading.dtype, "auto"), ("--autocast", step.autocast, "off"),
                ("--train", step.train, False))
    for flag, value, default in defaults:
        if value != default:
            raise UsageError(f"{flag} is for MODEL DATASET; with --run the script's own code decides it (its patch edits the script itself)")
    from dtype_doctor.run.launchers import split_launcher

    check_values(None, machine, None, findings)
    check_command(words, "fix")
    script_words, launch = split_launcher(words, machine.gpus)  # the launcher lines `run` takes
    options = dataclasses.replace(o.run_options(machine, findings, general, steps=fix.steps, launch=launch), horizon=fix.horizon)
    options.validated()
    return parse_command(script_words), options
