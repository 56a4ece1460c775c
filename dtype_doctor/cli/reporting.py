"""What scan, fix and run do around their engine: check the command line before torch, plan the
outputs, hold back the libraries' noise while the engine runs, then suppress, write and exit.

    options = check_model_and_dataset(model, dataset, batch, loading, machine, step, findings, general)
    reporting = Reporting.prepare(outputs, findings, model=model, dataset=dataset)
    with libraries(outputs) as say:
        report = scan(model, dataset, options, progress=say)
    report = reporting.finish(report)
    raise typer.Exit(reporting.exit_code(report))
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from dtype_doctor.cli import checks
from dtype_doctor.cli import options as o
from dtype_doctor.cli.output import OutputPlan, check_outputs, emit, exit_code, plan_outputs, quiet_libraries, stages


def check_model_and_dataset(model: str, dataset: str, batch: o.Batch, loading: o.Loading, machine: o.Machine, step: o.Step,
                   findings: o.Findings, general: o.General) -> Any:
    """MODEL DATASET and their options checked (no torch yet), as the ScanOptions they spell."""
    checks.model_path(model)  # the paths first: a stat each, where the values' checks import the catalogue
    checks.dataset_path(dataset)
    checks.user_file("--preprocess", batch.preprocess, function=True)
    check_values(loading, machine, step, findings)
    options = o.scan_options(batch, loading, machine, step, findings, general)
    options.validated()
    return options


def check_pipeline_folder(model: str, dataset: str | None, batch: o.Batch, loading: o.Loading, machine: o.Machine,
                          step: o.Step, findings: o.Findings, general: o.General, *, fixing: bool = False) -> Any:
    """PIPELINE_DIR [DATASET] checked (no torch yet): its model_index.json, the options a pipeline
    takes (--dtype may name components: float16,vae=float32; --simulate for scan, not fix), diffusers
    installed; as ScanOptions."""
    from dtype_doctor.load.pipeline_dir import check_pipeline_dir, refuse_options, require_diffusers

    if dataset is not None:
        checks.dataset_path(dataset)
    dtype, components = checks.component_dtypes(loading.dtype)
    loading = dataclasses.replace(loading, dtype=dtype)
    check_values(loading, machine, step, findings)
    options = dataclasses.replace(o.scan_options(batch, loading, machine, step, findings, general), component_dtypes=components)
    options.validated()
    refuse_options(options, fixing=fixing)
    index = check_pipeline_dir(model, trust_remote_code=options.trust_remote_code)
    for name, _ in components:
        checks.choice("--dtype component", name, index.modules)
    require_diffusers(model)
    return options


def quiet_diffusers(outputs: o.Outputs) -> None:
    """No component-loading bars or import notes from diffusers unless --verbose (as quiet_libraries for the rest)."""
    if outputs.verbose:
        return
    import os

    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")  # read as diffusers imports: its import notes too
    import logging

    import diffusers

    # Not even its errors: a load it cannot make is logged there and raised, and the raise becomes
    # the command's one line.
    diffusers.utils.logging.set_verbosity(logging.CRITICAL)
    diffusers.utils.logging.disable_progress_bar()


def pipeline_folder(model: str | None, dataset: str | None, prompt: str | None) -> bool:
    """Whether MODEL is a diffusers pipeline folder; for any other MODEL, DATASET is needed and --prompt refused."""
    from dtype_doctor.records.errors import UsageError
    from dtype_doctor.load.pipeline_dir import is_pipeline_dir

    if model is not None and is_pipeline_dir(model):
        return True
    if model is not None and dataset is None:
        raise UsageError("Missing argument 'DATASET' (only a diffusers pipeline folder, with model_index.json, needs none)")
    if prompt is not None:
        raise UsageError(f"--prompt is for a diffusers pipeline folder (model_index.json); {model} is not one")
    return False


def check_values(loading: o.Loading | None, machine: o.Machine | None, step: o.Step | None, findings: o.Findings) -> None:
    """The option values a user types (device, GPU, rule codes), each with a near name. The dtypes
    are ScanOptions.validate's to check, once (records.choices)."""
    if machine is not None:
        checks.device(machine.device)
        checks.gpu(machine.gpu)
    checks.codes("--select", findings.select)
    checks.codes("--ignore", findings.ignore)
    exit_code(None, findings.fail_on)


@contextlib.contextmanager
def libraries(outputs: o.Outputs) -> Iterator[Callable[[str], None]]:
    """Progress for the slow part, the libraries imported (their noise held back) as its first stage."""
    with stages(quiet=outputs.quiet) as say:
        quiet_libraries(verbose=outputs.verbose, say=say)
        yield say


def import_libraries(outputs: o.Outputs) -> None:
    """The libraries imported as the one stage a command says (run: the script's output follows)."""
    with libraries(outputs):
        pass


@dataclass(frozen=True)
class Reporting:
    """Where the report goes and which findings are held back, decided before anything loads."""

    plan: OutputPlan
    findings: o.Findings
    outputs: o.Outputs
    baseline: Any = None  # report.suppress.Baseline

    @classmethod
    def prepare(cls, outputs: o.Outputs, findings: o.Findings, *, reads: tuple[object, ...] = (),
                writes: tuple[tuple[str, Path | None], ...] = (), **inputs: Any) -> "Reporting":
        from dtype_doctor.report import FORMATS
        from dtype_doctor.report.suppress import Baseline

        plan = plan_outputs(outputs.format, outputs.output, FORMATS, quiet=outputs.quiet)
        if outputs.plot is not None:
            from dtype_doctor.report.ranges import check_plot_path

            check_plot_path(outputs.plot)
        checks.readable_file("--baseline", findings.baseline)
        written = (*(("--output", p) for p in plan.paths), ("--plot", outputs.plot),
                   ("--write-baseline", findings.write_baseline), *writes)
        check_outputs(reads=reads, writes=written, **inputs)
        baseline = Baseline.read(findings.baseline) if findings.baseline is not None else None
        return cls(plan, findings, outputs, baseline)

    def finish(self, report: Any) -> Any:
        """The report with its suppressed findings held back, written everywhere it goes."""
        from dtype_doctor.report.suppress import Baseline, suppress

        report = suppress(report, self.baseline)
        if self.findings.write_baseline is not None:
            Baseline.of(report).write(self.findings.write_baseline)
            if not self.outputs.quiet:
                import sys

                kept = len(report.findings) + len(getattr(report, "suppressed", ()))
                print(f"dtype-doctor: baseline of {kept} finding(s) written to {self.findings.write_baseline}", file=sys.stderr)
        if self.outputs.plot is not None:
            from dtype_doctor.report.ranges import write_plot

            write_plot(report, self.outputs.plot, quiet=self.outputs.quiet)
        emit(report, self.plan, self.findings.fail_on, plot=self.outputs.plot)
        return report

    def exit_code(self, report: Any) -> int:
        if self.findings.write_baseline is not None:
            return 0  # the findings were just accepted
        return exit_code(report, self.findings.fail_on)
