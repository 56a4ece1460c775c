"""Shared option declarations: scan and fix import these instead of redeclaring them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dtype_doctor.machine.control import DEFAULT_TIMEOUT  # noqa: F401 - the commands' --timeout default

Model = Annotated[str, typer.Argument(metavar="MODEL", help="Model directory (config.json + weights) or a hub id in the local cache.", show_default=False)]
Dataset = Annotated[str, typer.Argument(metavar="DATASET", help="save_to_disk directory, data file/folder (csv, json, jsonl, parquet, arrow, images) or a cached hub id.", show_default=False)]
Split = Annotated[Optional[str], typer.Option("--split", metavar="NAME", help="Dataset split (default: train, else the first split).")]
BatchSize = Annotated[int, typer.Option("--batch-size", metavar="N", help="Rows traced; only these rows are read and preprocessed.")]
Preprocess = Annotated[Optional[str], typer.Option("--preprocess", metavar="FILE.py:FUNC", help="Your map function, applied to the sampled rows as datasets.map would.")]
PreprocessMode = Annotated[str, typer.Option("--preprocess-mode", metavar="MODE", help="map (Dataset.map, stored in Arrow) or transform (Dataset.with_transform, applied on the fly).")]
DatasetFormat = Annotated[str, typer.Option("--dataset-format", metavar="FORMAT", help="Formatter between dataset and collator: torch, numpy or python.")]
Collator = Annotated[str, typer.Option("--collator", metavar="NAME", help="auto (the collator Trainer uses by default) or none (rows stacked as dataset[:n] gives them).")]
Device = Annotated[str, typer.Option("--device", metavar="DEVICE", help="auto|cpu|cuda|cuda:N — where the trace runs (auto: cuda when present).")]
Dtype = Annotated[str, typer.Option("--dtype", metavar="DTYPE", help="auto|float32|float16|bfloat16 — dtype the model is loaded with (auto = from_pretrained's default).")]
Autocast = Annotated[str, typer.Option("--autocast", metavar="DTYPE", help="off|float16|bfloat16 — trace the forward under torch.autocast.")]
Train = Annotated[bool, typer.Option("--train", help="Also run one backward pass; never changes the weights on disk.")]
Simulate = Annotated[bool, typer.Option("--simulate", help="Trace with fake tensors: no GPU, no weight data read; targets CUDA on a CPU-only machine.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", metavar="NAME|CC", help="GPU a --simulate CUDA trace targets: t4, v100, a10, l4, rtx4090, a100, h100, h200 or a compute capability (7.5); decides bfloat16 and fp8 support.")]
Gpus = Annotated[int, typer.Option("--gpus", metavar="N", help="Simulated GPUs (with --simulate): the model is spread over them by a device map, a launcher's world spans them.")]
DeviceMap = Annotated[Optional[str], typer.Option("--device-map", metavar="MAP", help="auto|balanced|balanced_low_0|sequential|FILE.json — accelerate's placement over the --gpus GPUs (default auto when --gpus > 1).")]
MaxMemory = Annotated[Optional[str], typer.Option("--max-memory", metavar="DEV=SIZE,...", help="Memory each device may hold, as accelerate's max_memory: 0=20GiB,1=20GiB,cpu=64GiB (default: the --gpu profile's).")]
Format = Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", help="rich|json|sarif|markdown|junit|github (default: rich).")]
Output = Annotated[Optional[Path], typer.Option("--output", "-o", metavar="PATH", help="Write the report to PATH instead of stdout.")]
FailOn = Annotated[str, typer.Option("--fail-on", metavar="SEVERITY", help="error|warning|info|never — the severity that makes the exit code 1.")]
Select = Annotated[Optional[str], typer.Option("--select", metavar="CODES", help="Comma-separated rule codes or prefixes to run (DD1,DD201).")]
Ignore = Annotated[Optional[str], typer.Option("--ignore", metavar="CODES", help="Comma-separated rule codes or prefixes to skip.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow code from the model repository to run (off by default).")]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", help="Allow loading pickled weights (pytorch_model.bin); safetensors only by default.")]
Timeout = Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Time limit on your code (preprocess functions; a script until its traced steps are done); 0: no limit.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]
LoadIn4bit = Annotated[bool, typer.Option("--load-in-4bit", help="Quantize the model's Linear layers to 4 bits with bitsandbytes while loading (needs dtype-doctor[quant]).")]
LoadIn8bit = Annotated[bool, typer.Option("--load-in-8bit", help="Quantize the model's Linear layers to int8 with bitsandbytes while loading (needs dtype-doctor[quant]).")]
BnbComputeDtype = Annotated[Optional[str], typer.Option("--bnb-compute-dtype", metavar="DTYPE", help="float32|float16|bfloat16 — bnb_4bit_compute_dtype (default: BitsAndBytesConfig's, float32).")]
BnbQuantType = Annotated[str, typer.Option("--bnb-quant-type", metavar="TYPE", help="nf4|fp4 — bnb_4bit_quant_type of --load-in-4bit.")]
# Read before the command line is parsed (cli/config.py); the parameter only shows it in --help.
Config = Annotated[Optional[Path], typer.Option("--config", metavar="PATH", help="Options from a TOML file (default: [tool.dtype-doctor] in ./pyproject.toml); the command line wins.")]


def split_codes(value: str | None) -> tuple[str, ...] | None:
    return tuple(c.strip() for c in value.split(",") if c.strip()) if value else None


def scan_options(values: dict) -> "ScanOptions":  # noqa: F821 - imported lazily
    """The ScanOptions a command's keyword arguments spell, by field name (scan and fix share them)."""
    from dataclasses import fields

    from dtype_doctor.pipeline import ScanOptions

    kwargs = {f.name: values[f.name] for f in fields(ScanOptions) if f.name in values}
    kwargs["select"], kwargs["ignore"] = split_codes(values.get("select")), split_codes(values.get("ignore"))
    return ScanOptions(**kwargs)
