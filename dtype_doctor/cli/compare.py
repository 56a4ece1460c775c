"""`dtype-doctor compare MODEL DATASET`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dtype_doctor.cli import options as o

EXAMPLES = """
Examples:

\b
  dtype-doctor compare fixtures/models/bert-tiny fixtures/data/text-cls

\b
  dtype-doctor compare ./my-model ./data.parquet --batch-size 16 \\
      --device cuda --format json -o compare.json

\b
  dtype-doctor compare ./my-model ./data --rows autocast-fp16,half --repeat 5
"""
ROWS = "Rows measured"
Rows = Annotated[Optional[str], typer.Option("--rows", "--variants", metavar="NAMES", rich_help_panel=ROWS, help="Comma-separated rows to measure, only these and fp32 (every row is measured against it): fp32, autocast-fp16, autocast-bf16, half, bfloat16, fp16-keep-fp32, and with bitsandbytes installed bnb-int8, bnb-nf4, bnb-fp4 (default: all these); with torchao, mxfp8 (asked for by name: its Linears in MXFP8, emulated below compute capability 10.0).")]
Repeat = Annotated[int, typer.Option("--repeat", metavar="N", rich_help_panel=ROWS, help="Timed runs per row; the median is shown.")]
Warmup = Annotated[int, typer.Option("--warmup", metavar="N", rich_help_panel=ROWS, help="Untimed runs per row before the memory and timed runs.")]
Format = Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", rich_help_panel=o.OUTPUT, help="rich|json (default: rich).")]
Output = Annotated[Optional[list[str]], typer.Option("--output", "-o", metavar="[FORMAT:]PATH", rich_help_panel=o.OUTPUT, help="Write the comparison to PATH (json by a .json suffix, else --format).", show_default=False)]
Train = Annotated[bool, typer.Option("--train", rich_help_panel=o.STEP, help="Time and measure memory of forward + backward instead of the forward alone.")]


@o.flat(omit=("simulate", "gpu", "gpus", "device_map", "max_memory", "autocast", "plot", "baseline", "write_baseline",
              "select", "ignore", "fail_on"),
        override={"format": Format, "output": Output, "train": Train})
def compare_command(model: o.Model, dataset: o.Dataset, *, rows: Rows = None, repeat: Repeat = 3, warmup: Warmup = 1, batch: o.Batch,
                    loading: o.Loading, machine: o.Machine, step: o.Step, findings: o.Findings, outputs: o.Outputs,
                    general: o.General) -> None:
    """Measure the batch under fp32, autocast fp16/bf16, .half(), .bfloat16() and fp16 with the
    minimal fp32 set: memory, time, error against fp32, overflow, one GradScaler step.

    A measurement: exit 0 whatever the rows show, 2 on bad input.
    """
    from dtype_doctor.cli.output import check_outputs, plan_outputs, write_text
    from dtype_doctor.cli.reporting import check_model_and_dataset, libraries
    from dtype_doctor.compare import compare_pipeline
    from dtype_doctor.compare.records import CompareRequest
    from dtype_doctor.compare.report import FORMATS, render
    from dtype_doctor.cli.output import text_width, wants_color

    plan = plan_outputs(outputs.format, outputs.output, tuple(FORMATS), quiet=outputs.quiet, what=" for compare")
    options = check_model_and_dataset(model, dataset, batch, loading, machine, step, findings, general)
    variants = o.split_codes(rows)
    CompareRequest(**({"variants": variants} if variants is not None else {}), repeat=repeat, warmup=warmup).validate()
    check_outputs(model=model, dataset=dataset, preprocess=batch.preprocess, config=general.config,
                  writes=tuple(("--output", p) for p in plan.paths))
    with libraries(outputs) as say:
        comparison = compare_pipeline(model, dataset, options, variants=variants, repeat=repeat, warmup=warmup, progress=say)
    for d in plan.files:
        write_text(render(comparison, d.format, width=text_width(), color=False), d.path, quiet=plan.quiet)
    if plan.stdout is not None:
        import sys

        write_text(render(comparison, plan.stdout.format, width=text_width(), color=wants_color(sys.stdout)), None)
