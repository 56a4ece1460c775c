"""`dtype-doctor scan MODEL DATASET`."""

from __future__ import annotations

import typer

from dtype_doctor.cli import options as o

EXAMPLES = """
Examples:

\b
  dtype-doctor scan fixtures/demo/model fixtures/demo/data

\b
  dtype-doctor scan ./my-model ./data.parquet --dtype float16 \\
      -o report.json -o results.sarif

\b
  dtype-doctor scan ./my-model ./images --preprocess prep.py:transform \\
      --simulate --device cuda
"""


@o.flat()
def scan_command(model: o.Model, dataset: o.Dataset, batch: o.Batch, loading: o.Loading, machine: o.Machine,
                 step: o.Step, findings: o.Findings, outputs: o.Outputs, general: o.General) -> None:
    """Trace one batch through MODEL and report every dtype and device mismatch."""
    from dtype_doctor.cli.reporting import Reporting, check_pipeline, libraries
    from dtype_doctor.pipeline import scan

    options = check_pipeline(model, dataset, batch, loading, machine, step, findings, general)
    reporting = Reporting.prepare(outputs, findings, model=model, dataset=dataset, preprocess=batch.preprocess,
                                  config=general.config)
    with libraries(outputs) as say:
        report = scan(model, dataset, options, progress=say)
    report = reporting.finish(report)
    raise typer.Exit(reporting.exit_code(report))
