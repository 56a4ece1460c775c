"""The options the commands share, as typed groups: import these, don't redeclare them.

Each group is a frozen dataclass whose fields are options (the `Annotated` aliases below, each
in its help panel). A command names the groups it takes as parameters (`batch: Batch`), and
`flat()` shows Typer their fields as flat options, so `--batch-size` is an option of every
command that takes `Batch`, declared once; the command receives the group records whole and
builds its engine options (`scan_options`, `run_options`) from them. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Mapping, Optional, TypeVar

import typer

from dtype_doctor.machine.control import DEFAULT_TIMEOUT
from dtype_doctor.machine.gpus import CAPABILITIES
from dtype_doctor.records.choices import AUTOCAST_DTYPES, COMPUTE_DTYPES, MODEL_DTYPES, said

# Help panels, in the order `--help` shows them.
DATA = "Dataset and batch"
LOADING = "Model loading"
MACHINE = "Device and simulation"
STEP = "Trace"
FINDINGS = "Findings"
OUTPUT = "Output"
GENERAL = "General"

# A --preprocess function is given a few rows: a minute is ample, and a function that loops
# forever is stopped long before `run`'s script limit (DEFAULT_TIMEOUT, 300 s).
PREPROCESS_TIMEOUT = 60.0

Model = Annotated[str, typer.Argument(metavar="MODEL", help="Model directory (config.json + weights) or a hub id in the local cache.", show_default=False)]
Dataset = Annotated[str, typer.Argument(metavar="DATASET", help="save_to_disk directory, data file/folder (csv, json, jsonl, parquet, arrow, images) or a cached hub id.", show_default=False)]
# scan and fix: a diffusers pipeline folder (model_index.json) takes no DATASET; its prompt is --prompt.
MaybeDataset = Annotated[Optional[str], typer.Argument(metavar="DATASET", help="save_to_disk directory, data file/folder (csv, json, jsonl, parquet, arrow, images) or a cached hub id; for a diffusers pipeline folder, optional: prompts (a prompt/text/caption column).", show_default=False)]
Prompt = Annotated[Optional[str], typer.Option("--prompt", metavar="TEXT", rich_help_panel=DATA, help="The prompt a diffusers pipeline folder (model_index.json) is called with (default: 'a photo').")]

Split = Annotated[Optional[str], typer.Option("--split", metavar="NAME", rich_help_panel=DATA, help="Dataset split (default: train, else the first split).")]
BatchSize = Annotated[int, typer.Option("--batch-size", metavar="N", rich_help_panel=DATA, help="Rows traced; only these rows are read and preprocessed.")]
Preprocess = Annotated[Optional[str], typer.Option("--preprocess", metavar="FILE.py:FUNC", rich_help_panel=DATA, help="Your map function, applied to the sampled rows as datasets.map would.")]
PreprocessMode = Annotated[str, typer.Option("--preprocess-mode", metavar="MODE", rich_help_panel=DATA, help="map (Dataset.map, stored in Arrow) or transform (Dataset.with_transform, applied on the fly).")]
DatasetFormat = Annotated[str, typer.Option("--dataset-format", metavar="FORMAT", rich_help_panel=DATA, help="Formatter between dataset and collator: torch, numpy or python.")]
Collator = Annotated[str, typer.Option("--collator", metavar="NAME", rich_help_panel=DATA, help="auto (the collator Trainer uses by default) or none (rows stacked as dataset[:n] gives them).")]

Dtype = Annotated[str, typer.Option("--dtype", metavar="DTYPE", rich_help_panel=LOADING, help=f"{said(MODEL_DTYPES)} (or fp32, fp16, half, bf16) — dtype the model is loaded with (auto = from_pretrained's default).")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", rich_help_panel=LOADING, help="Allow code from the model repository to run (off by default).")]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", rich_help_panel=LOADING, help="Allow loading pickled weights (pytorch_model.bin); safetensors only by default.")]
LoadIn4bit = Annotated[bool, typer.Option("--load-in-4bit", rich_help_panel=LOADING, help="Quantize the model's Linear layers to 4 bits with bitsandbytes while loading (needs dtype-doctor[quant]).")]
LoadIn8bit = Annotated[bool, typer.Option("--load-in-8bit", rich_help_panel=LOADING, help="Quantize the model's Linear layers to int8 with bitsandbytes while loading (needs dtype-doctor[quant]).")]
BnbComputeDtype = Annotated[Optional[str], typer.Option("--bnb-compute-dtype", metavar="DTYPE", rich_help_panel=LOADING, help=f"{said(COMPUTE_DTYPES)} — bnb_4bit_compute_dtype (default: BitsAndBytesConfig's, float32).")]
BnbQuantType = Annotated[str, typer.Option("--bnb-quant-type", metavar="TYPE", rich_help_panel=LOADING, help="nf4|fp4 — bnb_4bit_quant_type of --load-in-4bit.")]

Device = Annotated[str, typer.Option("--device", metavar="DEVICE", rich_help_panel=MACHINE, help="auto|cpu|cuda|cuda:N — where the trace runs (auto: cuda when present).")]
Simulate = Annotated[bool, typer.Option("--simulate", rich_help_panel=MACHINE, help="Trace with fake tensors: no GPU, no weight data read; targets CUDA on a CPU-only machine.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", metavar="NAME|CC", rich_help_panel=MACHINE, help=f"GPU a --simulate CUDA trace targets: {', '.join(CAPABILITIES)} or a compute capability (7.5); decides bfloat16 and fp8 support.")]
Gpus = Annotated[int, typer.Option("--gpus", metavar="N", rich_help_panel=MACHINE, help="Simulated GPUs (with --simulate): the model is spread over them by a device map, a launcher's world spans them.")]
ShareLayers = Annotated[bool, typer.Option("--share-layers/--no-share-layers", rich_help_panel=MACHINE, help="With --simulate: trace one of each set of identical layers and share its trace with the others (coverage.shared_layers); --no-share-layers traces every layer.")]
DeviceMap = Annotated[Optional[str], typer.Option("--device-map", metavar="MAP", rich_help_panel=MACHINE, help="auto|balanced|balanced_low_0|sequential|FILE.json — accelerate's placement over the --gpus GPUs (default auto when --gpus > 1).")]
Macos = Annotated[Optional[str], typer.Option("--macos", metavar="VERSION", rich_help_panel=MACHINE, help="macOS a --simulate --device mps target runs (14.4); default: the oldest the installed torch supports.")]
MaxMemory = Annotated[Optional[str], typer.Option("--max-memory", metavar="DEV=SIZE,...", rich_help_panel=MACHINE, help="Memory each device may hold, as accelerate's max_memory: 0=20GiB,1=20GiB,cpu=64GiB (default: the --gpu profile's).")]

Autocast = Annotated[str, typer.Option("--autocast", metavar="DTYPE", rich_help_panel=STEP, help=f"{said(AUTOCAST_DTYPES)} (or fp16, bf16) — trace the forward under torch.autocast.")]
Train = Annotated[bool, typer.Option("--train", rich_help_panel=STEP, help="Also run one backward pass; never changes the weights on disk.")]

FailOn = Annotated[str, typer.Option("--fail-on", metavar="SEVERITY", rich_help_panel=FINDINGS, help="error|warning|info|never — the severity that makes the exit code 1.")]
Select = Annotated[Optional[str], typer.Option("--select", metavar="CODES", rich_help_panel=FINDINGS, help="Comma-separated rule codes or prefixes to run (DD1,DD201).")]
Ignore = Annotated[Optional[str], typer.Option("--ignore", metavar="CODES", rich_help_panel=FINDINGS, help="Comma-separated rule codes or prefixes to skip.")]
Baseline = Annotated[Optional[Path], typer.Option("--baseline", metavar="FILE", rich_help_panel=FINDINGS, help="Findings accepted earlier (written by --write-baseline): held back by fingerprint, counted as suppressed.")]
WriteBaseline = Annotated[Optional[Path], typer.Option("--write-baseline", metavar="FILE", rich_help_panel=FINDINGS, help="Write this run's findings to FILE as the accepted baseline (exit 0).")]

Format = Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", rich_help_panel=OUTPUT, help="rich|json|sarif|markdown|junit|github (default: rich) — the report on stdout, or in a single --output.")]
Output = Annotated[Optional[list[str]], typer.Option("--output", "-o", metavar="[FORMAT:]PATH", rich_help_panel=OUTPUT, help="Write a report to PATH, its format from FORMAT: or the suffix (.json, .sarif, .xml junit, .md markdown, .txt rich); repeat for several.", show_default=False)]
Plot = Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.svg|png", rich_help_panel=OUTPUT, help="Draw each module's value range against fp16's and bf16's limits (needs dtype-doctor[plot]).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel=OUTPUT, help="No progress on stderr; errors and warnings only.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", rich_help_panel=OUTPUT, help="Let the libraries' own logging and progress bars through (transformers, datasets, bitsandbytes, torchao).")]

Timeout = Annotated[Optional[float], typer.Option("--timeout", metavar="SECONDS", rich_help_panel=GENERAL, help=f"Time limit on your code: a --preprocess function (default {PREPROCESS_TIMEOUT:.0f} s), a script until its traced steps are done (default {DEFAULT_TIMEOUT:.0f} s); 0: no limit.", show_default=False)]
Debug = Annotated[bool, typer.Option("--debug", rich_help_panel=GENERAL, help="Show tracebacks for errors.")]
# Read before the command line is parsed (cli/config.py); the parameter only shows it in --help.
Config = Annotated[Optional[Path], typer.Option("--config", metavar="PATH", rich_help_panel=GENERAL, help="Options from a TOML file (default: [tool.dtype-doctor] in ./pyproject.toml); the command line wins.")]


# ----------------------------------------------------------------------------- the groups


@dataclass(frozen=True)
class Batch:
    """Which rows are read and how the pipeline builds them into a batch."""

    split: Split = None
    batch_size: BatchSize = 2
    preprocess: Preprocess = None
    preprocess_mode: PreprocessMode = "map"
    dataset_format: DatasetFormat = "torch"
    collator: Collator = "auto"


@dataclass(frozen=True)
class Loading:
    """How the model is loaded."""

    dtype: Dtype = "auto"
    trust_remote_code: TrustRemoteCode = False
    allow_pickle: AllowPickle = False
    load_in_4bit: LoadIn4bit = False
    load_in_8bit: LoadIn8bit = False
    bnb_compute_dtype: BnbComputeDtype = None
    bnb_quant_type: BnbQuantType = "nf4"


@dataclass(frozen=True)
class Machine:
    """Where the step runs, real or simulated."""

    device: Device = "auto"
    simulate: Simulate = False
    gpu: Gpu = None
    gpus: Gpus = 1
    device_map: DeviceMap = None
    max_memory: MaxMemory = None
    share_layers: ShareLayers = True
    macos: Macos = None


@dataclass(frozen=True)
class Step:
    """What of the step is traced."""

    autocast: Autocast = "off"
    train: Train = False


@dataclass(frozen=True)
class Findings:
    """Which findings count: the rules run, the exit code's threshold, what was accepted earlier."""

    fail_on: FailOn = "error"
    select: Select = None
    ignore: Ignore = None
    baseline: Baseline = None
    write_baseline: WriteBaseline = None

    @property
    def selected(self) -> tuple[str, ...] | None:
        return split_codes(self.select)

    @property
    def ignored(self) -> tuple[str, ...] | None:
        return split_codes(self.ignore)


@dataclass(frozen=True)
class Outputs:
    """Where the report goes, in which formats, and how much is said on stderr meanwhile."""

    format: Format = None
    output: Output = None
    plot: Plot = None
    quiet: Quiet = False
    verbose: Verbose = False


@dataclass(frozen=True)
class General:
    timeout: Timeout = None
    debug: Debug = False
    config: Config = None

    def timeout_for(self, default: float) -> float:
        """--timeout as given, else the command's own default (a preprocess function's or a script's)."""
        return default if self.timeout is None else self.timeout


GROUPS = (Batch, Loading, Machine, Step, Findings, Outputs, General)


def split_codes(value: str | None) -> tuple[str, ...] | None:
    return tuple(c.strip() for c in value.split(",") if c.strip()) if value else None


# ----------------------------------------------------------------------------- flattening

F = TypeVar("F", bound=Callable[..., Any])


def flat(*, omit: Iterable[str] = (), override: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """The command as Typer should see it: each parameter typed with a group (a dataclass whose
    fields are options) becomes that group's fields, as flat options (less `omit`; `override` gives a field this command's own
    option declaration, e.g. its own help); the command is called with the group records."""
    omitted, replaced = set(omit), dict(override or {})

    def wrap(fn: F) -> F:
        hints = typing.get_type_hints(fn, include_extras=True)
        shown: list[inspect.Parameter] = []
        groups: dict[str, tuple[type, list[str]]] = {}
        for p in inspect.signature(fn).parameters.values():
            hint = hints.get(p.name, p.annotation)
            if isinstance(hint, type) and dataclasses.is_dataclass(hint):
                field_hints = typing.get_type_hints(hint, include_extras=True)
                names = []
                for f in dataclasses.fields(hint):
                    if f.name in omitted:
                        continue
                    annotation = replaced.get(f.name, field_hints[f.name])
                    shown.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=annotation))
                    names.append(f.name)
                groups[p.name] = (hint, names)
            else:
                shown.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hint))
        taken = [p.name for p in shown]
        if len(taken) != len(set(taken)):
            raise TypeError(f"{fn.__name__}: an option appears twice: {sorted(n for n in taken if taken.count(n) > 1)}")

        @functools.wraps(fn)
        def command(**values: Any) -> Any:
            kwargs = {name: cls(**{n: values.pop(n) for n in names}) for name, (cls, names) in groups.items()}
            return fn(**kwargs, **values)

        command.__signature__ = inspect.Signature(shown)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in shown}
        return command  # type: ignore[return-value]

    return wrap


# ----------------------------------------------------------------------------- engine options


def scan_options(batch: Batch, loading: Loading, machine: Machine, step: Step, findings: Findings,
                 general: General) -> "ScanOptions":  # noqa: F821 - imported lazily
    """The ScanOptions these groups spell (scan, fix and compare share them)."""
    from dtype_doctor.cli.checks import dtype_name
    from dtype_doctor.pipeline import ScanOptions

    return ScanOptions(
        **dataclasses.asdict(batch),
        **{**dataclasses.asdict(loading), "dtype": dtype_name(loading.dtype, "--dtype"),
           "bnb_compute_dtype": dtype_name(loading.bnb_compute_dtype, "--bnb-compute-dtype")},
        **dataclasses.asdict(machine),
        autocast=dtype_name(step.autocast, "--autocast"),
        train=step.train,
        select=findings.selected,
        ignore=findings.ignored,
        timeout=general.timeout_for(PREPROCESS_TIMEOUT),
    )


def run_options(machine: Machine, findings: Findings, general: General, *, steps: int, keep_running: bool = False,
                launch: Any = None, keep_writes: str | None = None) -> "RunOptions":  # noqa: F821 - imported lazily
    """The RunOptions of `run` and `fix --run`: the script's machine, its steps, the rules."""
    from dtype_doctor.run.runner import RunOptions

    return RunOptions(steps=steps, keep_running=keep_running, select=findings.selected, ignore=findings.ignored,
                      simulate=machine.simulate, device=machine.device, gpu=machine.gpu, gpus=machine.gpus, launch=launch, macos=machine.macos,
                      timeout=general.timeout_for(DEFAULT_TIMEOUT), keep_writes=keep_writes)
