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
      --format json -o report.json

\b
  dtype-doctor scan ./my-model ./images --preprocess prep.py:transform \\
      --simulate --device cuda
"""

def scan_command(
    model: o.Model,
    dataset: o.Dataset,
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
    gpus: o.Gpus = 1,
    device_map: o.DeviceMap = None,
    max_memory: o.MaxMemory = None,
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
    """Trace one batch through MODEL and report every dtype and device mismatch."""
    from dtype_doctor.cli.output import check_format, check_outputs, emit, exit_code, progress, quiet_libraries
    from dtype_doctor.pipeline import scan

    check_format(format)
    opts = o.scan_options(locals())
    exit_code(None, fail_on)  # validate --fail-on before the slow part
    check_outputs(locals())
    quiet_libraries()
    report = scan(model, dataset, opts, progress=progress())
    emit(report, format, output, fail_on)
    raise typer.Exit(exit_code(report, fail_on))
