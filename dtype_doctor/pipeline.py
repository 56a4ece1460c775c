"""`scan()`: the whole pipeline behind `dtype-doctor scan` — load → trace → rules → Report.

The CLI is a thin shell over this; `dtype_doctor.fix` builds on it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dtype_doctor.errors import UsageError
from dtype_doctor.records import Report

DEVICES_HELP = "auto|cpu|cuda|cuda:N"
MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
AUTOCAST = ("off", "float16", "bfloat16")


@dataclass(frozen=True)
class ScanOptions:
    """Everything `scan` and `fix` share; names follow the CLI options."""

    split: str | None = None
    batch_size: int = 2
    preprocess: str | None = None
    preprocess_mode: str = "map"
    dataset_format: str = "torch"
    device: str = "auto"
    dtype: str = "auto"
    autocast: str = "off"
    train: bool = False
    simulate: bool = False
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    max_length: int = 128
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, not {self.batch_size}")
        if self.dtype not in MODEL_DTYPES:
            raise UsageError(f"unknown --dtype {self.dtype!r}; choose one of: {', '.join(MODEL_DTYPES)}")
        if self.autocast not in AUTOCAST:
            raise UsageError(f"unknown --autocast {self.autocast!r}; choose one of: {', '.join(AUTOCAST)}")
        if self.preprocess_mode not in ("map", "transform"):
            raise UsageError(f"unknown --preprocess-mode {self.preprocess_mode!r}; choose map or transform")
        if self.dataset_format not in ("torch", "numpy", "python"):
            raise UsageError(f"unknown --dataset-format {self.dataset_format!r}; choose torch, numpy or python")
        if self.preprocess is not None and ":" not in self.preprocess:
            raise UsageError(f"--preprocess must be FILE.py:FUNCTION, not {self.preprocess!r}")
        resolve_device(self.device, self.simulate, check_only=True)
        from dtype_doctor.rules import parse_codes

        parse_codes(self.select)
        parse_codes(self.ignore)


def resolve_device(device: str, simulate: bool, *, check_only: bool = False) -> str:
    """'auto' → cuda when present (or the simulated target), else cpu."""
    import re

    if device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", device):
        raise UsageError(f"unknown --device {device!r}; use {DEVICES_HELP}")
    if check_only:
        return device
    if simulate:
        return "cuda:0" if device in ("auto", "cuda") else device
    import torch

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        from dtype_doctor.errors import InputError

        raise InputError(f"--device {device} asked for but no CUDA device is available; add --simulate to check a CUDA target without a GPU")
    return "cuda:0" if device == "cuda" else device


def scan(
    model: str,
    dataset: str,
    options: ScanOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Load MODEL and the first rows of DATASET, build the batch as the pipeline would,
    trace it and return the Report."""
    options = options or ScanOptions()
    options.validate()
    say = progress or (lambda _msg: None)
    from dtype_doctor.load import build_batch, load_model, load_rows
    from dtype_doctor.trace.engine import diagnose

    device = resolve_device(options.device, options.simulate)
    say(f"loading model {model}")
    loaded = load_model(
        model,
        dtype=options.dtype,
        trust_remote_code=options.trust_remote_code,
        simulate=options.simulate,
        device="cpu" if options.simulate else device,
        allow_pickle=options.allow_pickle,
    )
    say(f"reading {options.batch_size} row(s) of {dataset}")
    rows = load_rows(dataset, split=options.split, n=options.batch_size)
    say("building the batch")
    batch = build_batch(
        loaded,
        rows,
        preprocess=options.preprocess,
        preprocess_mode=options.preprocess_mode,
        dataset_format=options.dataset_format,
        device="cpu" if options.simulate else device,
    )
    say("tracing")
    return diagnose(
        loaded.model,
        batch.inputs,
        device=device if options.simulate else None,
        autocast=None if options.autocast == "off" else options.autocast,
        train=options.train,
        simulate=options.simulate,
        select=options.select,
        ignore=options.ignore,
        lineage=batch.lineage,
        sources=batch.sources,
        target={"model": model, "dataset": dataset, "split": rows.split},
    )
