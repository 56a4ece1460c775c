"""Writing a report: data to stdout and --output files, everything else to stderr.

    plan = plan_outputs(outputs, formats)    # which format goes where, decided before anything loads
    with stages(outputs) as say:             # progress on stderr while the slow part runs
        report = scan(..., progress=say)
    emit(report, plan, fail_on)

stdout carries one report at most; `--output` (repeatable) writes others beside it, each in the
format its `FORMAT:` prefix or suffix names. Colour follows the stream it is written to, with
NO_COLOR and FORCE_COLOR (https://no-color.org, https://force-color.org) over the terminal test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from dtype_doctor.records.errors import UsageError

# A report file's format from its suffix; anything else needs FORMAT:PATH (or --format).
SUFFIX_FORMATS = {".json": "json", ".sarif": "sarif", ".xml": "junit", ".md": "markdown", ".txt": "rich", ".log": "github"}


@dataclass(frozen=True)
class Destination:
    format: str
    path: Path | None  # None: stdout


@dataclass(frozen=True)
class OutputPlan:
    """Where each report goes: stdout (at most one) and files."""

    stdout: Destination | None
    files: tuple[Destination, ...]
    quiet: bool = False

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(d.path for d in self.files if d.path is not None)


def plan_outputs(fmt: str | None, outputs: list[str] | None, known: tuple[str, ...], *, quiet: bool = False,
                 stdout_is_terminal: bool | None = None, what: str = "") -> OutputPlan:
    """--format and the --output list as destinations.

    No --output: the --format report (rich by default) on stdout. One --output and an explicit
    --format: that format in that file, nothing on stdout (as before --output could repeat).
    Otherwise each --output takes the format of its FORMAT: prefix, else of its suffix, else
    --format, else rich; stdout gets the --format report when --format names none of the files,
    and the rich report when stdout is a terminal (the console beside the files)."""
    from dtype_doctor.cli import checks

    checks.formats(fmt, known, what)
    specs = list(outputs or [])
    if not specs:
        return OutputPlan(Destination(fmt or "rich", None), (), quiet)
    if len(specs) == 1 and fmt is not None and format_prefix(specs[0], known) is None:
        return OutputPlan(None, (Destination(fmt, _path(specs[0])),), quiet)
    files = []
    for spec in specs:
        prefixed = format_prefix(spec, known)
        if prefixed is not None:
            name, rest = prefixed
            files.append(Destination(name, _path(rest)))
            continue
        suffix = "".join(Path(spec).suffixes[-1:]).lower()
        by_suffix = SUFFIX_FORMATS.get(suffix)
        files.append(Destination(by_suffix if by_suffix in known else fmt or "rich", _path(spec)))
    used = {d.format for d in files}
    to_stdout = [d for d in files if d.path is None]
    if len(to_stdout) > 1:
        raise UsageError("more than one --output names stdout (-); give the others a file")
    if to_stdout:
        stdout = to_stdout[0]
    elif fmt is not None and fmt not in used:
        stdout = Destination(fmt, None)
    elif stdout_is_terminal if stdout_is_terminal is not None else sys.stdout.isatty():
        stdout = Destination("rich", None)
    else:
        stdout = None
    return OutputPlan(stdout, tuple(d for d in files if d.path is not None), quiet)


def format_prefix(spec: str, known: tuple[str, ...]) -> tuple[str, str] | None:
    """('sarif', 'out/x.sarif') for `sarif:out/x.sarif`; None where the text before ':' is no format."""
    name, sep, rest = spec.partition(":")
    if sep and name in known and rest:
        return name, rest
    if sep and rest and len(name) > 1 and name.isalpha():
        from dtype_doctor.cli.checks import did_you_mean

        near = did_you_mean(name, known)
        if near:  # `sairf:out.sarif` is a typo, not a file name with a colon in it
            raise UsageError(f"--output {spec}: unknown format {name!r}{near} (choose one of: {', '.join(known)})")
    return None


def _path(text: str) -> Path | None:
    return None if text == "-" else Path(text)


def wants_color(stream: Any) -> bool:
    """NO_COLOR (set and not empty) turns colour off, FORCE_COLOR turns it on; else: a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return bool(getattr(stream, "isatty", lambda: False)())


def emit(report: Any, plan: OutputPlan, fail_on: str, *, plot: Path | None = None) -> None:
    """The report to each destination of `plan`, after the loading warning (stderr)."""
    from dtype_doctor.report import render
    from dtype_doctor.rules import all_rules

    loading = getattr(getattr(report, "target", None), "loading", None)
    warning = loading.warning() if loading is not None else None
    if warning:
        print(f"dtype-doctor: warning: {warning}", file=sys.stderr)
    rules = all_rules()
    for d in plan.files:
        text = render(report, d.format, width=None, color=False, fail_on=fail_on, rules=rules, plot=_linked(plot, d.path))
        write_text(text, d.path, quiet=plan.quiet)
    if plan.stdout is not None:
        color = wants_color(sys.stdout)
        width = text_width() if plan.stdout.format == "rich" else None
        text = render(report, plan.stdout.format, width=width, color=color, fail_on=fail_on, rules=rules, plot=_linked(plot, None))
        write_text(text, None)


def _linked(plot: Path | None, output: Path | None) -> str | None:
    """The plot as a report written to `output` links it: relative to that file's folder."""
    if plot is None:
        return None
    if output is None:
        return plot.as_posix()
    return Path(os.path.relpath(plot.absolute(), output.absolute().parent)).as_posix()


def write_text(text: str, output: Path | None, *, quiet: bool = False) -> None:
    """Rendered output to stdout, or to `output` with a line on stderr saying where."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from dtype_doctor.records.files import write_atomic

    write_atomic(output, text)
    if not quiet:
        print(f"report written to {output}", file=sys.stderr)


def text_width() -> int:
    """Columns for rich text: $COLUMNS when set (piped output too), else the terminal's, else 100."""
    import shutil

    from dtype_doctor.report import DEFAULT_WIDTH

    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def exit_code(report: Any, fail_on: str) -> int:
    """1 when the report has findings at or above fail_on; with report=None only validates."""
    from dtype_doctor.cli.checks import choice
    from dtype_doctor.report.common import FAIL_ON

    choice("--fail-on", fail_on, FAIL_ON)
    return 1 if report is not None and report.at_or_above(fail_on) else 0


# ----------------------------------------------------------------------------- progress

STAGE_PREFIX = "dtype-doctor: ["  # a stage line on a pipe: `dtype-doctor: [3.2 s] tracing`


class Stages:
    """Progress on stderr, one stage at a time, with the time since the command began.

    On a terminal: a spinner with the stage and its elapsed time, and each finished stage kept
    as a line with its duration. On a pipe (CI logs): one line as each stage starts, with the
    seconds elapsed so far. Nothing with --quiet."""

    def __init__(self, *, quiet: bool = False, terminal: bool | None = None) -> None:
        self.quiet = quiet
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.begun = time.monotonic()
        self.current: tuple[str, float] | None = None
        self._progress: Any = None
        self._task: Any = None

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not self.terminal:
            print(f"{STAGE_PREFIX}{now - self.begun:.1f} s] {message}", file=sys.stderr, flush=True)
            return
        self._finish(now)
        if self._progress is None:
            self._start_live()
        self._task = self._progress.add_task(message, total=None)
        self.current = (message, now)

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True, no_color=not wants_color(sys.stderr) or None)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=console, transient=True)
        self._progress.start()

    def _finish(self, now: float) -> None:
        if self.current is None or self._progress is None:
            return
        message, began = self.current
        self._progress.remove_task(self._task)
        self._progress.console.print(f"[green]✓[/green] {_escape(message)} [dim]{now - began:.1f} s[/dim]", highlight=False)
        self.current = None

    def close(self) -> None:
        if self.quiet:
            return
        if self.terminal:
            self._finish(time.monotonic())
            if self._progress is not None:
                self._progress.stop()
                self._progress = None


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@contextlib.contextmanager
def stages(*, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A Stages for the slow part of a command; the live display ends before the report prints."""
    reporter = Stages(quiet=quiet)
    try:
        yield reporter
    finally:
        reporter.close()


# ----------------------------------------------------------------------------- the libraries' noise

# Libraries that log to stderr while they import, not when they run: torchao on a CPU build of
# torch logs each CUDA extension it cannot load (in its __init__), and torch's pytree logs each
# Enum a library registers (transformers' quantizers import torchao as a model loads). The CLI owns
# stderr: a filter on each of these loggers drops the records those import-time places make, for
# the whole command, so the libraries are imported only when something needs them (importing
# torchao up front, to hold its lines back, cost 1.0-2.5 s of every command). Their other records,
# a deprecation torchao logs as a script configures it, still show.
IMPORT_NOISE = {"torchao": ("torchao/__init__.py", None), "torch.utils._pytree": ("torch/utils/_pytree.py", "_private_register_pytree_node")}
# Loggers held at ERROR unless --verbose: their INFO/WARNING lines are the libraries talking to
# themselves (bitsandbytes logs its CPU backend and each 8-bit matmul's cast, by the hundred).
NOISY_LOGGERS = ("bitsandbytes", "torchao", "accelerate", "peft", "huggingface_hub", "filelock", "urllib3")


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


def quiet_libraries(*, verbose: bool = False, say: Callable[[str], None] | None = None) -> None:
    """The CLI owns stderr: no weight-loading bars, load reports or library logs unless --verbose.
    Importing the libraries is the first stage a user waits through, so it is said as one."""
    import warnings

    if say is not None and "transformers" not in sys.modules:
        say("importing torch and transformers")
    hold_back_import_noise()

    import transformers

    # Fake tensors under --simulate have no storage; torch warns when libraries ask for one.
    warnings.filterwarnings("ignore", message=".*data_ptr.*")
    # bitsandbytes' LLM.int8 says on every call that it quantizes activations through float16
    # (the quantized rows of compare, a --load-in-8bit trace); the report says it once.
    warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")
    if verbose:
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="bitsandbytes")
    warnings.filterwarnings("ignore", module="torchao")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    quiet_datasets()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_datasets() -> None:
    """datasets without bars or logs, not even its errors: a data file it cannot parse is logged
    there ("Failed to read file …") and raised, and the raise becomes the command's one line.
    Most commands never load a dataset (a script run, a scan without one), so datasets is not
    imported for this (0.5 s): set on the module when it is loaded, else by the environment it
    reads when it is."""
    datasets = sys.modules.get("datasets")
    if datasets is None:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("DATASETS_VERBOSITY", "critical")
        return
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)


def check_outputs(*, model: str | None = None, dataset: str | None = None, preprocess: str | None = None,
                  script: Any = None, config: Path | None = None, reads: tuple[object, ...] = (),
                  writes: tuple[tuple[str, Path | None], ...] = ()) -> None:
    """Refuse (exit 2, before anything loads) an output (a report, a patch, a plot, a baseline)
    that names a file the command reads: MODEL and DATASET (their files, and anything inside
    their directories), --preprocess, --script, --config (or ./pyproject.toml), and `reads` (a
    script run); or a folder, or a place under a file."""
    from dtype_doctor.cli import checks
    from dtype_doctor.cli.config import PYPROJECT
    from dtype_doctor.records.files import local_inputs, refuse_overlap

    for flag, path in writes:
        checks.writable_file(flag, path)
    inputs = local_inputs(model, dataset, preprocess, script, config or PYPROJECT, *reads)
    refuse_overlap(writes, inputs)
