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
  dtype-doctor compare ./my-model ./data --variants fp32,autocast-fp16,half --repeat 5
"""
Variants = Annotated[Optional[str], typer.Option("--variants", metavar="NAMES", help="Comma-separated rows to measure (fp32 always): fp32, autocast-fp16, autocast-bf16, half, bfloat16, fp16-keep-fp32, and with bitsandbytes installed bnb-int8, bnb-nf4, bnb-fp4 (default: all).")]
Repeat = Annotated[int, typer.Option("--repeat", metavar="N", help="Timed runs per row; the median is shown.")]
Warmup = Annotated[int, typer.Option("--warmup", metavar="N", help="Untimed runs per row before the memory and timed runs.")]
Format = Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", help="rich|json (default: rich).")]
Train = Annotated[bool, typer.Option("--train", help="Time and measure memory of forward + backward instead of the forward alone.")]


def compare_command(
    model: o.Model,
    dataset: o.Dataset,
    variants: Variants = None,
    repeat: Repeat = 3,
    warmup: Warmup = 1,
    split: o.Split = None,
    batch_size: o.BatchSize = 2,
    preprocess: o.Preprocess = None,
    preprocess_mode: o.PreprocessMode = "map",
    dataset_format: o.DatasetFormat = "torch",
    collator: o.Collator = "auto",
    device: o.Device = "auto",
    dtype: o.Dtype = "auto",
    train: Train = False,
    format: Format = None,
    output: o.Output = None,
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
    """Measure the batch under fp32, autocast fp16/bf16, .half(), .bfloat16() and fp16 with the
    minimal fp32 set: memory, time, error against fp32, overflow, one GradScaler step.

    A measurement: exit 0 whatever the rows show, 2 on bad input.
    """
    from dtype_doctor.cli.output import check_outputs, progress, quiet_libraries, text_width, write_text
    from dtype_doctor.compare import compare_pipeline
    from dtype_doctor.compare.report import FORMATS, render
    from dtype_doctor.errors import UsageError

    fmt = format or "rich"
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r} for compare; choose one of: {', '.join(FORMATS)}")
    opts = o.scan_options(locals())
    check_outputs(locals())
    quiet_libraries()
    comparison = compare_pipeline(
        model, dataset, opts, variants=o.split_codes(variants), repeat=repeat, warmup=warmup, progress=progress()
    )
    write_text(render(comparison, fmt, width=text_width(), color=output is None and _tty()), output)


def _tty() -> bool:
    import sys

    return sys.stdout.isatty()
