"""Turn the changes a verified fix applied into a unified diff against the user's code.

Each change gets an ordered chain of codemods, and the first that applies wins:
  1. rewrite the cast at the lineage's source location in the --preprocess function, in
     any dtype family (float → int included);
  2. cast the value where that function returns it;
  3. the --script pipeline, right before the forward;
  4. the documented fix module (a new dtype_doctor_fix.py).
keep-fp32 always lands in the fix module: its keep_fp32(model) carries the module list and
the input-casting hooks, which no one-line edit of a script could.
A preprocess edit is offered only where it survives to the model: datasets' torch formatter
turns every stored float into float32 and every int into int64, so a half or int32 cast
made inside a `Dataset.map` function is undone before the batch is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dtype_doctor.fix import codemods as cm
from dtype_doctor.fix.outcome import Change, CodemodOutcome, PatchOutcome, Step
from dtype_doctor.fix.patch import make_patch, read_source, repo_root

LABEL_KEYS = ("labels", "label", "label_ids")
# What datasets' torch formatter makes of a stored column: the dtypes that survive it.
FORMATTER_KEEPS = frozenset({"float32", "int64", "bool"})


@dataclass(frozen=True)
class Attempt:
    """One codemod on one file, tried in turn for a change."""

    file: Path
    codemod: cm.Codemod


@dataclass(frozen=True)
class Chain:
    """The ordered attempts for one change, ending in the fix module when no user code takes it."""

    change: Change
    strategy: str
    attempts: tuple[Attempt, ...]


@dataclass(frozen=True)
class PatchPlan:
    chains: tuple[Chain, ...]
    findings: tuple[str, ...] = ()
    module_file: Path | None = None  # where the fix module goes


@dataclass(frozen=True)
class UserCode:
    """The user's code a patch may edit, and how the batch reaches the model."""

    preprocess: str | None = None  # FILE.py:FUNC
    preprocess_mode: str = "map"
    dataset_format: str = "torch"
    script: Path | None = None

    @property
    def preprocess_file(self) -> Path | None:
        return Path(self.preprocess.rpartition(":")[0]).resolve() if self.preprocess else None

    @property
    def preprocess_function(self) -> str | None:
        return self.preprocess.rpartition(":")[2] if self.preprocess else None

    def survives_preprocess(self, dtype: str) -> bool:
        """Whether a dtype set in the preprocess function reaches the model as it is."""
        return self.preprocess_mode != "map" or self.dataset_format != "torch" or dtype in FORMATTER_KEEPS


def plan_patch(
    steps: Iterable[Step],
    *,
    code: UserCode,
    device_type: str,
    model_dtype: str | None,
    findings: Iterable[str] = (),
    root: Path,
) -> PatchPlan:
    chains = []
    for step in steps:
        if step.status != "applied":
            continue
        for c in step.changes:
            attempts = [*_preprocess_attempts(c, code), *_script_attempts(c, code.script, device_type, model_dtype)]
            chains.append(Chain(c, step.strategy, tuple(attempts)))
    return PatchPlan(tuple(chains), tuple(findings), root / cm.NewFixModule.FILENAME)


def _preprocess_attempts(c: Change, code: UserCode) -> list[Attempt]:
    file, func = code.preprocess_file, code.preprocess_function
    if c.kind != "cast-input" or file is None or func is None or not code.survives_preprocess(c.to):
        return []
    at_source = c.source is not None and Path(c.source.file).resolve() == file
    attempts = []
    if at_source:
        attempts.append(Attempt(file, cm.RetargetCast(func, c.to, key=c.target, lines=[c.source.line])))
    attempts.append(Attempt(file, cm.RetargetCast(func, c.to, key=c.target)))
    # A cast the key analysis cannot tie to the output: the one cast of the right family.
    attempts.append(Attempt(file, cm.RetargetCast(func, c.to, from_dtype=c.before)))
    attempts.append(Attempt(file, cm.CastReturnedValue(func, c.target, c.to)))
    return attempts


def _script_attempts(c: Change, script: Path | None, device_type: str, model_dtype: str | None) -> list[Attempt]:
    if script is None:
        return []
    if c.kind == "cast-input":
        if c.target in LABEL_KEYS:
            mods = [cm.LabelsToLong(key=c.target)] if c.to == "int64" else [cm.CastBatch(keys=(c.target,), dtype=c.to)]
        else:
            # Casting to the model's own dtype reads best (and survives a later dtype change).
            mods = [cm.CastBatch(keys=(c.target,), dtype=None if c.to == model_dtype else c.to)]
    elif c.kind == "convert-model":
        mods = [cm.SetLoadDtype(c.to), cm.RemoveModelConversion()]
    elif c.kind == "autocast":
        mods = [cm.WrapForwardInAutocast(device_type=device_type, dtype=c.to)]
    elif c.kind == "move-input":
        mods = [cm.MoveBatchToDevice()]
    elif c.kind == "trainable-fp32":
        # The script converted the whole (trainable) model to half: keep it as loaded.
        mods = [cm.RemoveModelConversion(from_dtype="float16"), cm.RemoveModelConversion(from_dtype="bfloat16")]
    else:
        mods = []
    if not mods:
        return []
    return [Attempt(script, mods[0] if len(mods) == 1 else cm.AllOf(mods))]


def _module_params(strategy: str, c: Change, device_type: str) -> tuple[str, dict[str, Any]]:
    if c.kind == "cast-input":
        return "cast-inputs", {"dtype": c.to, "keys": [c.target]} if c.to not in ("int64", "bool") else {"index_keys": [c.target]}
    if c.kind == "convert-model":
        return "half-model", {"dtype": c.to}
    if c.kind == "autocast":
        return ("fp32-trainable" if strategy == "fp32-trainable" else "autocast"), {"dtype": c.to, "device_type": device_type}
    if c.kind == "move-input":
        return "to-device", {"device": c.to}
    if c.kind == "keep-fp32":
        return "keep-fp32", {"dtype": c.to} if c.target == "model" else {"modules": [c.target]}
    return strategy, {}


def write(plan: PatchPlan, path: Path, *, root: Path, force: bool, device_type: str = "cpu") -> PatchOutcome:
    """Try each change's chain, write PATH (and nothing else), or say why nothing could be written."""
    texts: dict[Path, str] = {}
    originals: dict[Path, str] = {}
    outcomes: list[CodemodOutcome] = []
    leftover: list[Chain] = []

    def current(file: Path) -> str:
        if file not in texts:
            originals[file] = texts[file] = read_source(file) if file.exists() else ""
        return texts[file]

    for chain in plan.chains:
        for attempt in chain.attempts:
            result = attempt.codemod.apply(current(attempt.file), attempt.file.name)
            outcomes.append(CodemodOutcome(str(attempt.file), result.codemod, result.status, result.detail))
            if result.applied and result.new_source is not None:
                texts[attempt.file] = result.new_source
                break
        else:
            leftover.append(chain)
    notes: list[str] = []
    if leftover and plan.module_file is not None:
        module, notes = _fix_module(leftover, plan.findings, device_type)
        result = module.apply(current(plan.module_file), plan.module_file.name)
        outcomes.append(CodemodOutcome(str(plan.module_file), result.codemod, result.status, result.detail))
        if result.applied and result.new_source is not None:
            texts[plan.module_file] = result.new_source
    edits = [(f, originals[f], texts[f]) for f in texts if texts[f] != originals[f]]
    if not edits:
        # Nothing to write: say why instead of leaving an empty patch git apply rejects.
        reasons = "; ".join(f"{o.codemod}: {o.detail}" for o in outcomes if o.status != "applied") or "no edit planned"
        return PatchOutcome(None, (), tuple(outcomes), tuple(notes), skipped=reasons)
    patch = make_patch(path, edits, root=root, force=force)
    return PatchOutcome(str(patch.path), tuple(patch.files), tuple(outcomes), tuple(notes))


def _fix_module(chains: list[Chain], findings: tuple[str, ...], device_type: str) -> tuple[cm.NewFixModule, list[str]]:
    """One fix module for the changes no user code took (one strategy per module)."""
    params = [_module_params(ch.strategy, ch.change, device_type) for ch in chains]
    strategy, first = params[0]
    notes = [f"{other}: one fix module per patch; apply it by hand or pass --script" for other, _ in params[1:] if other != strategy]
    merged = dict(first)
    keys = sorted({k for s, p in params if s == strategy for k in p.get("keys", ())})
    if keys:
        merged["keys"] = keys
    index_keys = sorted({k for s, p in params if s == strategy for k in p.get("index_keys", ())})
    if index_keys:
        merged["index_keys"] = index_keys
    modules = list(dict.fromkeys(m for s, p in params if s == strategy for m in p.get("modules", ())))
    if modules:
        merged["modules"] = modules
        merged.setdefault("dtype", next((p["dtype"] for s, p in params if s == strategy and "dtype" in p), None))
    merged["findings"] = list(findings)
    return cm.NewFixModule(strategy, merged), notes


def default_root(*paths: str | Path | None) -> Path:
    for p in paths:
        if p:
            return repo_root(Path(p))
    return repo_root(Path.cwd())
