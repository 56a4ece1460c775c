"""Writing a report: data to stdout or --output, everything else to stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from dtype_doctor.errors import UsageError


def emit(report: Any, fmt: str | None, output: Path | None, fail_on: str) -> None:
    from dtype_doctor.report import render
    from dtype_doctor.rules import all_rules

    loading = getattr(getattr(report, "target", None), "loading", None)
    warning = loading.warning() if loading is not None else None
    if warning:
        print(f"dtype-doctor: warning: {warning}", file=sys.stderr)
    fmt = fmt or "rich"
    to_terminal = output is None and sys.stdout.isatty()
    width = text_width() if fmt == "rich" else None
    text = render(report, fmt, width=width, color=to_terminal, fail_on=fail_on, rules=all_rules())
    write_text(text, output)


def write_text(text: str, output: Path | None) -> None:
    """Rendered output to stdout, or to `output` with a line on stderr saying where."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from dtype_doctor.files import write_atomic

    write_atomic(output, text)
    print(f"report written to {output}", file=sys.stderr)


def text_width() -> int:
    """Columns for rich text: $COLUMNS when set (piped output too), else the terminal's, else 100."""
    import shutil

    from dtype_doctor.report import DEFAULT_WIDTH

    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def exit_code(report: Any, fail_on: str) -> int:
    """1 when the report has findings at or above fail_on; with report=None only validates."""
    from dtype_doctor.report.common import FAIL_ON

    if fail_on not in FAIL_ON:
        raise UsageError(f"unknown --fail-on {fail_on!r}; choose one of: {', '.join(FAIL_ON)}")
    return 1 if report is not None and report.at_or_above(fail_on) else 0


def check_format(fmt: str | None) -> None:
    from dtype_doctor.report import FORMATS

    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")


def progress() -> Any:
    """A progress callback that writes to stderr (a spinner line on a terminal)."""
    if not sys.stderr.isatty():
        return lambda msg: None
    from rich.console import Console

    console = Console(stderr=True)
    return lambda msg: console.print(f"[dim]· {msg}…[/dim]", highlight=False)


# Libraries that log to stderr while they import, not when they run: torchao on a CPU build of
# torch logs each CUDA extension it cannot load (in its __init__), and torch's pytree logs each
# Enum a library registers (transformers' quantizers import torchao as a model loads). The CLI owns
# stderr: a filter on each of these loggers drops the records those import-time places make, for
# the whole command, so the libraries are imported only when something needs them (importing
# torchao up front, to hold its lines back, cost 1.0-2.5 s of every command). Their other records,
# a deprecation torchao logs as a script configures it, still show.
IMPORT_NOISE = {"torchao": ("torchao/__init__.py", None), "torch.utils._pytree": ("torch/utils/_pytree.py", "_private_register_pytree_node")}


class _ImportNoise(logging.Filter):
    def __init__(self, path: str, function: str | None) -> None:
        super().__init__()
        self.path, self.function = path, function

    def filter(self, record: logging.LogRecord) -> bool:
        here = record.pathname.replace("\\", "/").endswith(self.path)
        return not (here and (self.function is None or record.funcName == self.function))


def hold_back_import_noise() -> None:
    for name, (path, function) in IMPORT_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ImportNoise) for f in logger.filters):
            logger.addFilter(_ImportNoise(path, function))


def quiet_libraries() -> None:
    """The CLI owns stderr: no weight-loading bars or load reports from the libraries."""
    import warnings

    hold_back_import_noise()

    import datasets
    import transformers

    # Fake tensors under --simulate have no storage; torch warns when libraries ask for one.
    warnings.filterwarnings("ignore", message=".*data_ptr.*")
    # bitsandbytes' LLM.int8 says on every call that it quantizes activations through float16
    # (the quantized rows of compare, a --load-in-8bit trace); the report says it once.
    warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def check_outputs(values: dict, *, reads: tuple[object, ...] = ()) -> None:
    """Refuse (exit 2, before anything loads) an --output or --write-patch that names a file the
    command reads: MODEL and DATASET (their files, and anything inside their directories),
    --preprocess, --script, --config (or ./pyproject.toml), and `reads` (a script run)."""
    from dtype_doctor.cli.config import PYPROJECT
    from dtype_doctor.files import local_inputs, refuse_overlap

    config = values.get("config") or PYPROJECT
    inputs = local_inputs(values.get("model"), values.get("dataset"), values.get("preprocess"), values.get("script"),
                          config, *reads)
    refuse_overlap((("--output", values.get("output")), ("--write-patch", values.get("write_patch"))), inputs)
