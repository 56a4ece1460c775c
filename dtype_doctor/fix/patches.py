"""Turn the changes a verified fix applied into a unified diff against the user's code.

Each change gets an ordered chain of codemods (its strategy's `edits`), and the first that
applies (and, where the pipeline can be re-run, leaves it running) wins:
  1. rewrite the cast at the lineage's source location in the --preprocess function, in
     any dtype family (float → int included);
  2. rewrite the cast that builds the output of that name, wherever it is;
  3. cast the value at every return of that function;
  4. the --script pipeline, right before the forward;
  5. the documented fix module (dtype_doctor_fix.py), one for every change no user code took.
The preprocess attempts are offered only for a value that passes through the function (a
label the collator renames from the dataset's column never does) and only where the cast
survives to the model: datasets' torch formatter turns every stored float into float32 and
every int into int64, so a half or int32 cast made inside a `Dataset.map` function is undone
before the batch is built. keep-fp32 always lands in the fix module: its keep_fp32(model)
carries the module list and the input-casting hooks, which no one-line edit of a script could.

A patch is written whole or not at all: `verify` re-runs the patched pipeline (the caller
builds it on temporary copies of the patched files) after each preprocess attempt and on the
whole patch; a change that lands nowhere is named in `PatchOutcome.unwritten`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtype_doctor.fix import codemods as cm
from dtype_doctor.fix.codemods.base import Attempt  # noqa: F401 - the strategies' edits name it here too
from dtype_doctor.fix.outcome import Change, CodemodOutcome, PatchOutcome, Step
from dtype_doctor.fix.patch import make_patch, read_source, repo_root
from dtype_doctor.fix.strategies import STRATEGIES, Site, describe
from dtype_doctor.load.batch.preprocess import split_spec
# What datasets' torch formatter makes of a stored column: the dtypes that survive it.
FORMATTER_KEEPS = frozenset({"float32", "int64", "bool"})

# Re-runs the pipeline with these file texts: None when it runs (and, given a change, that
# change's input reaches the model in its dtype), else why not. `transform`: the fix module
# whose `preprocess` builds the batch, when the patch has one (None: the user's function does).
Verify = Callable[..., "str | None"]  # (texts, change, *, transform=None)


@dataclass(frozen=True)
class Chain:
    """The ordered attempts for one change, ending in the fix module when no user code takes it."""

    change: Change
    strategy: str
    attempts: tuple[Attempt, ...]


@dataclass(frozen=True)
class UserCode:
    """The user's code a patch may edit, and how the batch reaches the model."""

    preprocess: str | None = None  # FILE.py:FUNC
    preprocess_mode: str = "map"
    dataset_format: str = "torch"
    script: Path | None = None
    # The model inputs whose value passes through the preprocess function (None: not known).
    outputs: frozenset[str] | None = None
    # How the fix module's `preprocess` builds the batch (NewFixModule's `transform`).
    transform: Mapping[str, Any] | None = None
    # `dtype-doctor scan MODEL DATASET` and the options of the scanned pipeline, less those the
    # fix module changes (--preprocess, --preprocess-mode, --dtype, --autocast, given apart).
    scan: tuple[str, ...] = ()
    dtype: str = "auto"
    autocast: str = "off"

    @property
    def preprocess_file(self) -> Path | None:
        return Path(split_spec(self.preprocess)[0]).resolve() if self.preprocess else None

    @property
    def preprocess_function(self) -> str | None:
        return split_spec(self.preprocess)[1] if self.preprocess else None

    def survives_preprocess(self, dtype: str) -> bool:
        """Whether a dtype set in the preprocess function reaches the model as it is."""
        return self.preprocess_mode != "map" or self.dataset_format != "torch" or dtype in FORMATTER_KEEPS

    def passes_through(self, key: str) -> bool:
        """Whether model input `key` is a value the preprocess function returns."""
        return self.outputs is None or key in self.outputs


@dataclass(frozen=True)
class PatchPlan:
    chains: tuple[Chain, ...]
    findings: tuple[str, ...] = ()
    module_file: Path | None = None  # where the fix module goes
    code: UserCode = field(default_factory=UserCode)


def plan_patch(
    steps: Iterable[Step],
    *,
    code: UserCode,
    device_type: str,
    model_dtype: str | None,
    findings: Iterable[str] = (),
    root: Path,
) -> PatchPlan:
    site = Site(device_type=device_type, model_dtype=model_dtype, script=code.script, code=code)
    chains = []
    for step in steps:
        if step.status != "applied":
            continue
        for c in step.changes:
            attempts = STRATEGIES[c.kind].edits(c, site)
            chains.append(Chain(c, step.strategy, tuple(attempts)))
    return PatchPlan(tuple(chains), tuple(findings), root / cm.NewFixModule.FILENAME, code)


class FileEdits:
    """The user's files as the codemods change them, in memory: each read once, the first
    attempt of a chain that applies (and passes `check`) wins. `fix --write-patch` and
    `fix --run` both edit through it."""

    def __init__(self, shown: Callable[[Path], str] = str) -> None:
        self.texts: dict[Path, str] = {}
        self.originals: dict[Path, str] = {}
        self.outcomes: list[CodemodOutcome] = []
        self._shown = shown

    def current(self, file: Path) -> str:
        if file not in self.texts:
            self.originals[file] = self.texts[file] = read_source(file) if file.exists() else ""
        return self.texts[file]

    def record(self, file: Path, result: Any, problem: str | None = None) -> bool:
        """Note `result` of a codemod on `file`; keep its text when it applied and had no problem."""
        if problem:
            self.outcomes.append(CodemodOutcome(self._shown(file), result.codemod, "failed", f"{result.detail}; re-run: {problem}"))
            return False
        self.outcomes.append(CodemodOutcome(self._shown(file), result.codemod, result.status, result.detail))
        if result.applied and result.new_source is not None:
            self.texts[file] = result.new_source
            return True
        return False

    def first_that_applies(self, attempts: Sequence[Attempt], check: Callable[[Attempt, dict[Path, str]], str | None] | None = None) -> bool:
        for attempt in attempts:
            result = attempt.codemod.apply(self.current(attempt.file), attempt.file.name)
            problem = None
            if result.applied and result.new_source is not None and check is not None:
                problem = check(attempt, {**self.texts, attempt.file: result.new_source})
            if self.record(attempt.file, result, problem):
                return True
        return False

    @property
    def changed(self) -> dict[Path, str]:
        return {f: t for f, t in self.texts.items() if t != self.originals[f]}


def write(
    plan: PatchPlan,
    path: Path,
    *,
    root: Path,
    force: bool,
    device_type: str = "cpu",
    verify: Verify | None = None,
) -> PatchOutcome:
    """Try each change's chain, re-run the patched pipeline, and write PATH (and nothing else);
    or say why nothing could be written."""
    edits = FileEdits()
    leftover: list[Chain] = []
    for chain in plan.chains:

        def check(attempt: Attempt, texts: dict[Path, str], change: Change = chain.change) -> str | None:
            # The preprocess function is re-run with the edit: a patch must never break the pipeline.
            return verify(texts, change) if verify is not None and attempt.file == plan.code.preprocess_file else None

        if not edits.first_that_applies(chain.attempts, check):
            leftover.append(chain)
    unwritten: list[str] = []
    transform = False  # whether the fix module's `preprocess` is in the patch
    if leftover and plan.module_file is not None:
        file = plan.module_file
        module = _fix_module(leftover, plan, device_type, force, transform=True)
        result = module.apply(edits.current(file), file.name)
        if result.applied and result.new_source is not None and verify is not None and module.transform is not None:
            problem = verify({**edits.texts, file: result.new_source}, None, transform=file)
            if problem:
                # The transform cannot carry the casts (say, bfloat16 rows the collator's numpy
                # cannot hold): the module keeps apply_fix for the user's own loop.
                edits.record(file, result, problem)
                module = _fix_module(leftover, plan, device_type, force, transform=False)
                result = module.apply(edits.current(file), file.name)
        if edits.record(file, result):
            transform = module.transform is not None
        else:
            unwritten = [f"{describe(ch.change)} ({result.detail})" for ch in leftover]
    outcomes = edits.outcomes
    changed = [(f, edits.originals[f], t) for f, t in edits.changed.items()]
    if not changed:
        # Nothing to write: say why instead of leaving an empty patch git apply rejects.
        reasons = "; ".join(f"{o.codemod}: {o.detail}" for o in outcomes if o.status != "applied") or "no edit planned"
        return PatchOutcome(None, (), tuple(outcomes), skipped=reasons)
    parts = _module_parts(leftover, device_type) if leftover and not unwritten else {}
    # The whole patch, re-run; not when the module casts only in apply_fix, which scan cannot see.
    if verify is not None and not unwritten and not (_casts(parts) and not transform):
        problem = verify(edits.changed, None, transform=plan.module_file if transform else None)
        if problem:
            return PatchOutcome(None, (), tuple(outcomes), skipped=f"the patched pipeline was re-run and {problem}")
    patch = make_patch(path, changed, root=root, force=force)
    check = _check_command(parts, plan, transform) if parts else None
    notes = ()
    if _casts(parts) and not transform:
        notes = (f"{plan.module_file.name if plan.module_file else 'the fix module'}: call apply_fix(model, batch) on each "
                 "batch before the forward; scan cannot check a cast made in your own loop",)
    return PatchOutcome(str(patch.path), tuple(patch.files), tuple(outcomes), notes, unwritten=tuple(unwritten), check=check)


def _fix_module(chains: list[Chain], plan: PatchPlan, device_type: str, force: bool, *, transform: bool) -> cm.NewFixModule:
    """One fix module holding every change no user code took (with `transform`, the casts also
    as a datasets transform, where the pipeline gives one)."""
    parts = _module_parts(chains, device_type)
    spec = plan.code.transform if transform and _casts(parts) else None
    check = _check_command(parts, plan, spec is not None)
    return cm.NewFixModule(parts=list(parts.items()), findings=plan.findings, transform=spec, check=check, replace=force)


def _check_command(parts: Mapping[str, Any], plan: PatchPlan, transform: bool) -> str | None:
    """The `scan` that checks the pipeline with the fix module in it; None where scan cannot
    express it (apply_fix in a training loop of the user's, keep-fp32's hooks)."""
    import shlex

    code = plan.code
    # Each part says the scan options that check it, in auto's order (a later one wins: a
    # converted model's dtype over fp32-trainable's float32); None: scan cannot express it.
    said = [STRATEGIES[s].scan_options(p) for s, p in sorted(parts.items(), key=lambda sp: STRATEGIES[sp[0]].rank)]
    if not code.scan or plan.module_file is None or any(o is None for o in said):
        return None
    words = list(code.scan)
    if _casts(parts):
        if not transform:
            return None  # apply_fix only: scan cannot see a batch the user's own loop casts
        words += ["--preprocess", f"{_relative(plan.module_file)}:preprocess", "--preprocess-mode", "transform"]
    elif code.preprocess:
        words += ["--preprocess", code.preprocess, "--preprocess-mode", code.preprocess_mode]
    options = {"--dtype": code.dtype, "--autocast": code.autocast}
    for o in said:
        options.update(o or {})
    words += ["--dtype", options["--dtype"]] if options["--dtype"] != "auto" else []
    words += ["--autocast", options["--autocast"]] if options["--autocast"] != "off" else []
    return shlex.join(words)


def _casts(parts: Mapping[str, Any]) -> bool:
    """Whether the fix module casts the batch (a part with module_casts: cast-inputs')."""
    return any(STRATEGIES[s].module_casts(p) for s, p in parts.items())


def _relative(file: Path) -> str:
    import os

    return os.path.relpath(file)


def _module_parts(chains: list[Chain], device_type: str) -> dict[str, dict[str, Any]]:
    """NewFixModule's parts for the changes in `chains`, one part a strategy."""
    parts: dict[str, dict[str, Any]] = {}
    site = Site(device_type=device_type)
    for ch in chains:
        STRATEGIES[ch.change.kind].module_part(parts, ch.change, site)
    return parts


def default_root(*paths: str | Path | None) -> Path:
    for p in paths:
        if p:
            return repo_root(Path(p))
    return repo_root(Path.cwd())
