"""`scan()`: the whole pipeline behind `dtype-doctor scan` — load → trace → rules → Report.

The CLI is a thin shell over this; `dtype_doctor.fix` builds on it too.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterator

from dtype_doctor.records.errors import UsageError
from dtype_doctor.machine.placement import CUDA0, Placement, decide, parse_device
from dtype_doctor.load.batch.state import DATASET_FORMATS, PREPROCESS_MODES
from dtype_doctor.records import Report, Subject
from dtype_doctor.records.choices import AUTOCAST_DTYPES, DTYPE_ALIASES, MODEL_DTYPES, CheckedOnce, choice
from dtype_doctor.load.memory import MAX_BATCH_SIZE
from dtype_doctor.machine.control import DEFAULT_TIMEOUT, check_timeout
from dtype_doctor.trace.heap import long_lived_heap
from dtype_doctor.trace.request import TraceRequest



@dataclass(frozen=True)
class ScanOptions(CheckedOnce):
    """Everything `scan` and `fix` share; names follow the CLI options."""

    split: str | None = None
    batch_size: int = 2
    preprocess: str | None = None
    preprocess_mode: str = "map"
    dataset_format: str = "torch"
    collator: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    autocast: str = "off"
    train: bool = False
    simulate: bool = False
    gpu: str | None = None  # the GPU a simulated CUDA trace targets (--gpu)
    gpus: int = 1  # simulated GPUs a device map spreads the model over (--gpus)
    device_map: str | None = None  # auto|balanced|balanced_low_0|sequential|FILE.json (--device-map)
    max_memory: str | None = None  # "0=20GiB,cpu=64GiB" (--max-memory)
    share_layers: bool = True  # a simulated trace shares identical layers' work (--no-share-layers: off)
    macos: str | None = None  # the macOS a simulated mps target runs (--macos; machine/mps_placement.py)
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    max_length: int = 128
    timeout: float | None = DEFAULT_TIMEOUT  # seconds the user's code may take (--timeout; 0: no limit)
    # bitsandbytes quantization applied while loading (--load-in-4bit / --load-in-8bit)
    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_compute_dtype: str | None = None
    bnb_quant_type: str = "nf4"
    # A diffusers pipeline folder's components loaded in their own dtype (--dtype float16,vae=float32)
    component_dtypes: tuple[tuple[str, str], ...] = ()
    # The Placement an entry decided itself (compare, refusing simulation); None: `placement` decides it
    decided_placement: Placement | None = field(default=None, compare=False, repr=False)

    def validate(self) -> None:
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, not {self.batch_size}")
        check_timeout(self.timeout)
        if self.batch_size > MAX_BATCH_SIZE:
            raise UsageError(f"--batch-size {self.batch_size} is more than the {MAX_BATCH_SIZE} rows a trace reads; "
                             "a dtype trace needs a batch, not an epoch")
        choice("--dtype", self.dtype, MODEL_DTYPES, aliases=tuple(DTYPE_ALIASES))  # the one check of --dtype on scan/fix/compare
        choice("--autocast", self.autocast, AUTOCAST_DTYPES, aliases=("fp16", "bf16", "half"))
        if self.preprocess_mode not in PREPROCESS_MODES:
            raise UsageError(f"unknown --preprocess-mode {self.preprocess_mode!r}; choose {_either(PREPROCESS_MODES)}")
        if self.dataset_format not in DATASET_FORMATS:
            raise UsageError(f"unknown --dataset-format {self.dataset_format!r}; choose {_either(DATASET_FORMATS)}")
        if self.preprocess is not None and ":" not in self.preprocess:
            raise UsageError(f"--preprocess must be FILE.py:FUNCTION, not {self.preprocess!r}")
        parse_device(self.device)
        self.quantize()  # a bad combination is a usage error before anything loads
        if self.gpus != 1 or self.device_map or self.max_memory or self.macos or str(self.device).startswith("mps"):
            self.placement  # noqa: B018 - --gpus/--device-map/--max-memory: refused here, before anything loads
        if self.gpu is not None:
            from dtype_doctor.machine.gpus import check_gpu

            check_gpu(self.gpu)  # a bad name is a usage error before anything loads
            if not self.simulate:
                raise UsageError("--gpu sets the GPU a --simulate trace targets; add --simulate (a real trace runs on the GPU it has)")
        from dtype_doctor.rules import parse_codes

        parse_codes(self.select)
        parse_codes(self.ignore)

    def quantize(self) -> "Quantize | None":  # noqa: F821 - load.quantize, imported lazily
        from dtype_doctor.load.quantize import Quantize

        return Quantize.from_options(self.load_in_4bit, self.load_in_8bit, self.bnb_compute_dtype, self.bnb_quant_type,
                                     simulate=self.simulate, mapped=self.device_map is not None or self.gpus > 1)

    def decided(self, placement: Placement) -> "ScanOptions":
        """These options with their Placement already decided by the entry (compare decides its own,
        refusing simulation): no stage decides it again."""
        options = replace(self, decided_placement=placement)
        if self.__dict__.get("_checked"):
            object.__setattr__(options, "_checked", True)  # the same values, checked already
        return options

    @cached_property
    def placement(self) -> Placement:
        """Where the step runs: decided here, once, for every stage of scan and fix."""
        if self.decided_placement is not None:
            return self.decided_placement
        return decide(self.device, simulate=self.simulate, gpu=self.gpu, gpus=self.gpus, device_map=self.device_map,
                      max_memory=self.max_memory, macos=self.macos)


def _either(names: tuple[str, ...]) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class Prepared:
    """A loaded model and the batch the user's pipeline would build, ready to trace."""

    loaded: Any
    rows: Any
    batch: Any
    device: str
    options: ScanOptions
    model_spec: str
    dataset_spec: str

    def request(self) -> TraceRequest:
        o = self.options
        return TraceRequest(
            # a real model was loaded onto its device: the trace runs where it is
            placement=o.placement if o.simulate else replace(o.placement, device=None),
            autocast=o.autocast,
            train=o.train,
            select=o.select,
            ignore=o.ignore,
            lineage=self.batch.lineage,
            sources=self.batch.sources,
            subject=Subject(self.model_spec, self.dataset_spec, self.rows.split),
            loaded=getattr(self.loaded, "load_facts", None),
            share_layers=o.share_layers,
        )


def prepare(
    model: str,
    dataset: str,
    options: ScanOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Prepared:
    """Load MODEL and the first rows of DATASET and build the batch as the pipeline would."""
    options = (options or ScanOptions()).validated()
    say = progress or (lambda _msg: None)
    from dtype_doctor.load import build_batch, load_model, load_rows
    from dtype_doctor.machine.home import simulated_home

    device = options.placement.device
    assert device is not None  # the CLI always names one ("auto" decided)
    say(f"loading model {model}")
    loaded = load_model(
        model,
        dtype=options.dtype,
        trust_remote_code=options.trust_remote_code,
        # where a simulated model's fake weights are built (the trace runs copies at their home)
        placement=replace(options.placement, device=str(simulated_home(device, loaded=True))) if options.placement.simulated else options.placement,
        allow_pickle=options.allow_pickle,
        quantize=options.quantize(),
        target=options.placement,
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
        device=device,  # simulated: fake tensors on the target, so the lineage shows the transfer
        max_length=options.max_length,
        collator=options.collator,
        timeout=options.timeout,
    )
    return Prepared(loaded, rows, batch, device, options, model, dataset)


def scan(
    model: str,
    dataset: str,
    options: ScanOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Load, build the batch, trace it and return the Report."""
    from dtype_doctor.diagnosis import diagnose

    refused = refused_load(model, dataset, options or ScanOptions())
    if refused is not None:
        return refused
    with memory_named(options or ScanOptions()), long_lived_heap():
        p = prepare(model, dataset, options, progress=progress)
        if progress:
            progress("tracing")
        request = p.request()
        with _inference_forward(request):
            return with_loading(diagnose(p.loaded.model, p.batch.inputs, request), p)


def _inference_forward(request: TraceRequest) -> Any:
    """A simulated scan without --train runs its forward without gradients, as an inference forward
    does (and the hand-written check of a big model's shapes under FakeTensorMode): no autograd graph
    of fake tensors that nothing reads. No rule reads the grad mode (the parameters' requires_grad and
    --train are what they read). A real scan keeps the caller's grad mode: real kernels choose their
    path by it (trace/engine.py)."""
    import contextlib

    if request.simulate and not request.train:
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def refused_load(model: str, dataset: str, options: ScanOptions) -> Report | None:
    """The report of a load transformers refuses before any step: a bitsandbytes model whose
    simulated device map offloads without llm_int8_enable_fp32_cpu_offload (DD505); else None."""
    options.validated()
    quantize = options.quantize()
    if quantize is None and not options.placement.simulated:
        return None
    from dtype_doctor.diagnosis import environment, judged
    from dtype_doctor.load.offload import refused_trace, scan_refusal
    from dtype_doctor.records import Target
    placement = options.placement
    refusal = scan_refusal(model, quantize, placement)
    if refusal is None:
        return None
    gpu = placement.profile
    trace = refused_trace(refusal, device=placement.device or CUDA0, simulated=True, gpu=gpu)
    findings = judged(trace, select=options.select, ignore=options.ignore)
    target = Target(model, dataset, options.split, trace.device, True, None, None, options.train, gpu=trace.gpu,
                    quantization=refusal.quantization)
    return Report(findings=findings, target=target, environment=environment(), trace=trace)


def with_loading(report: Report, p: Prepared) -> Report:
    """The report with transformers' load report in `target.loading` when weights were missing or extra."""
    import dataclasses

    loading = getattr(p.loaded, "loading", None)
    if loading is None:
        return report
    return dataclasses.replace(report, target=dataclasses.replace(report.target, loading=loading))


@contextmanager
def memory_named(options: ScanOptions) -> Iterator[None]:
    """Running out of memory is bad input naming the batch size (exit 2), not a finding or a crash."""
    from dtype_doctor.records.errors import InputError, is_out_of_memory, memory_words

    try:
        yield
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise InputError(f"out of memory with --batch-size {options.batch_size} ({memory_words(exc)}); "
                         "lower --batch-size, or pass --simulate to trace without allocating") from None


def fix(
    model: str,
    dataset: str,
    options: ScanOptions | None = None,
    *,
    settings: "FixSettings | None" = None,  # noqa: F821 - fix.settings, imported lazily
    write_patch: str | None = None,
    script: str | None = None,
    progress: Callable[[str], None] | None = None,
    **fixing: Any,
) -> Report:
    """Diagnose, fix in memory, re-verify, measure, and optionally write the fix as a patch.
    `settings` (a fix.settings.FixSettings), or its fields as keywords (strategy=, fail_on=, ...)."""
    from dtype_doctor.fix.engine import fix_model
    from dtype_doctor.fix.settings import FixSettings

    settings = FixSettings.of(settings, fixing)
    if fixing:
        raise TypeError(f"fix() got unexpected keyword argument(s): {', '.join(fixing)}")
    strategy, fail_on, force = settings.strategy, settings.fail_on, settings.force
    patch_path, script_path = fix_files(write_patch, script, force=force)
    refused = refused_load(model, dataset, options or ScanOptions())
    if refused is not None:
        return _unfixable_load(refused, strategy)
    with memory_named(options or ScanOptions()):
        p = prepare(model, dataset, options, progress=progress)
        if progress:
            progress("tracing and fixing")
        result = fix_model(p.loaded.model, p.batch.inputs, p.request(), settings=settings)
    if patch_path is None:
        return with_loading(result.report(None), p)
    if not result.verified:
        return with_loading(result.report(None, patch_skipped="the fix was not verified, so it is not written"), p)
    if not result.applied:
        return with_loading(result.report(None), p)  # nothing to fix, so nothing to patch: no file written
    return with_loading(result.report(_write_patch(p, result, patch_path, script_path, fail_on=fail_on, force=force)), p)


def _write_patch(p: Prepared, result: Any, patch_path: Any, script_path: Any, *, fail_on: str, force: bool) -> Any:
    """Write the verified fix as a patch against the user's code, re-running the patched pipeline first."""
    from pathlib import Path

    from dtype_doctor.fix import patches
    from dtype_doctor.fix.rerun import PatchedRun

    o = p.options
    fn = p.batch.preprocess_fn  # the loaded PreprocessFn: its file as the user wrote it
    root = patches.default_root(script_path, fn.file if fn is not None else None)
    code = patches.UserCode(
        preprocess=o.preprocess,
        preprocess_mode=o.preprocess_mode,
        dataset_format=o.dataset_format,
        script=script_path,
        outputs=frozenset(k for k, steps in p.batch.lineage.items() if any(s.stage == "preprocess" for s in steps)),
        transform=_transform(p, root),
        scan=_scan_words(p, fail_on),
        dtype=o.dtype,
        autocast=o.autocast,
    )
    device_type = p.device.split(":")[0]
    plan = patches.plan_patch(
        result.applied,
        code=code,
        device_type=device_type,
        model_dtype=result.before.target.model_dtype,
        findings=[f"{f.code} {f.module or '<model>'}: {f.message}" for f in result.before.findings],
        root=root,
    )
    verify = PatchedRun(p, result.pipeline.model, result.pipeline.request, fail_on, root, root / Path(plan.module_file).name)
    return patches.write(plan, patch_path, root=root, force=force, device_type=device_type, verify=verify)


def _transform(p: Prepared, root: Any) -> dict[str, Any] | None:
    """How the fix module's datasets transform builds the batch: the user's own function (by its
    path from the root), else the model's processor called as the processor stage calls it."""
    import os

    o, fn = p.options, p.batch.preprocess_fn
    if fn is not None:  # as load_preprocess loaded it: how datasets maps it, what it takes
        rel = os.path.relpath(fn.path, root)
        if rel.startswith(".."):
            return None
        return {"kind": "user", "path": rel, "function": fn.name, "batched": fn.batched, "accepts": list(fn.accepts)}
    from dtype_doctor.load.batch.processors import processor_call

    return processor_call(p.rows.dataset, p.loaded, max_length=o.max_length)


def _scan_words(p: Prepared, fail_on: str) -> tuple[str, ...]:
    """`dtype-doctor scan MODEL DATASET` with the options of this pipeline that a fix module
    leaves as they are (not --preprocess, --preprocess-mode, --dtype or --autocast)."""
    o, default = p.options, ScanOptions()
    words = ["dtype-doctor", "scan", p.model_spec, p.dataset_spec]
    for name in ("split", "batch_size", "dataset_format", "collator", "device", "gpu"):
        if getattr(o, name) != getattr(default, name):
            words += [f"--{name.replace('_', '-')}", str(getattr(o, name))]
    if fail_on != "error":
        words += ["--fail-on", fail_on]
    for name in ("select", "ignore"):
        if getattr(o, name):
            words += [f"--{name}", ",".join(getattr(o, name))]
    for name in ("bnb_compute_dtype", "bnb_quant_type"):
        if (o.load_in_4bit or o.load_in_8bit) and getattr(o, name) != getattr(default, name):
            words += [f"--{name.replace('_', '-')}", str(getattr(o, name))]
    for flag, on in (("--train", o.train), ("--simulate", o.simulate), ("--trust-remote-code", o.trust_remote_code),
                     ("--allow-pickle", o.allow_pickle), ("--load-in-4bit", o.load_in_4bit), ("--load-in-8bit", o.load_in_8bit)):
        if on:
            words.append(flag)
    return tuple(words)


def _unfixable_load(report: Report, strategy: str) -> Report:
    """`fix MODEL DATA` of a load transformers refuses: nothing loaded to fix in memory; the fixes
    the findings name are a keyword of the user's own config, which `fix --run` writes and verifies."""
    import dataclasses

    from dtype_doctor.fix.outcome import FixOutcome, Step

    names = dict.fromkeys(r.strategy for f in report.findings for r in f.remedies)
    why = ("transformers refuses to load the model, so there is no model to fix in memory; the fix is a keyword of "
           "your script's BitsAndBytesConfig(...): dtype-doctor fix --run -- python SCRIPT.py writes and verifies it")
    steps = tuple(Step(n, "skipped", why) for n in names)
    outcome = FixOutcome(strategy, steps, False, report.findings, report.summary, True, 0, why)
    return dataclasses.replace(report, fix=outcome)


def fix_files(write_patch: str | None, script: str | None, *, force: bool) -> tuple[Any, Any]:
    """fix's files checked before anything loads (its FixSettings, the strategy among them, are
    checked where they are built): the patch file is new (or --force), --script exists.
    (patch path or None, resolved script path or None)."""
    from pathlib import Path

    from dtype_doctor.records.errors import InputError

    patch_path = Path(write_patch) if write_patch else None
    if patch_path is not None and patch_path.exists() and not force:
        raise UsageError(f"patch file {patch_path} already exists; pass --force to overwrite it")
    script_path = Path(script).resolve() if script else None
    if script_path is not None and not script_path.is_file():
        raise InputError(f"--script {script}: no such file")
    return patch_path, script_path
