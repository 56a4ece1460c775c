"""Turn the changes a verified fix applied into a unified diff against the user's code.

Where the change goes: the --preprocess file when the lineage says the bad dtype was made
there; the --script pipeline otherwise; and when neither is given, a new small module with
a documented apply_fix(). A codemod that cannot find its target is reported as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dtype_doctor.fix import codemods as cm
from dtype_doctor.fix.patch import make_patch, read_source, repo_root
from dtype_doctor.fix.outcome import Change, CodemodOutcome, PatchOutcome, Step

LABEL_KEYS = ("labels", "label", "label_ids")


@dataclass(frozen=True)
class PatchPlan:
    """The codemods to run, per file."""

    per_file: dict[Path, list[cm.Codemod]]
    notes: tuple[str, ...] = ()


def plan_patch(
    steps: Iterable[Step],
    *,
    preprocess: str | None,
    script: Path | None,
    device_type: str,
    model_dtype: str | None,
    findings: Iterable[str] = (),
    root: Path,
) -> PatchPlan:
    pre_file, pre_func = _split_preprocess(preprocess)
    per_file: dict[Path, list[cm.Codemod]] = {}
    fallback: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []

    def add(path: Path, mod: cm.Codemod) -> None:
        per_file.setdefault(path, []).append(mod)

    for step in steps:
        if step.status != "applied":
            continue
        for c in step.changes:
            if c.kind == "cast-input" and pre_file and _made_in(c, pre_file):
                if c.to == "int64":
                    add(pre_file, cm.CastLabelsToLong(pre_func, lines=[c.source.line] if c.source else None))
                else:
                    add(pre_file, cm.RetargetCast(pre_func, c.to, from_dtype=c.before))
            elif script is not None:
                for mod in _script_codemods(c, device_type, model_dtype):
                    add(script, mod)
            else:
                fallback.append(_module_params(step.strategy, c, device_type))
    if fallback:
        strategy, params = fallback[0]
        for other, _ in fallback[1:]:
            if other != strategy:
                notes.append(f"{other}: one fix module per patch; apply it by hand or pass --script")
        keys = sorted({k for s, p in fallback if s == strategy for k in p.get("keys", ())})
        if keys:
            params["keys"] = keys
        params["findings"] = list(findings)
        add(root / cm.NewFixModule.FILENAME, cm.NewFixModule(strategy, params))
    return PatchPlan(per_file, tuple(notes))


def _split_preprocess(preprocess: str | None) -> tuple[Path | None, str | None]:
    if not preprocess:
        return None, None
    file, _, func = preprocess.rpartition(":")
    return Path(file).resolve(), func


def _made_in(c: Change, pre_file: Path) -> bool:
    if c.stage == "preprocess":
        return True
    return c.source is not None and Path(c.source.file).resolve() == pre_file


def _script_codemods(c: Change, device_type: str, model_dtype: str | None) -> list[cm.Codemod]:
    if c.kind == "cast-input":
        if c.target in LABEL_KEYS:
            return [cm.LabelsToLong(key=c.target)] if c.to == "int64" else [cm.CastBatch(keys=(c.target,), dtype=c.to)]
        # Casting to the model's own dtype reads best (and survives a later dtype change).
        return [cm.CastBatch(keys=(c.target,), dtype=None if c.to == model_dtype else c.to)]
    if c.kind == "convert-model":
        return [cm.SetLoadDtype(c.to), cm.RemoveModelConversion()]
    if c.kind == "autocast":
        return [cm.WrapForwardInAutocast(device_type=device_type, dtype=c.to)]
    if c.kind == "move-input":
        return [cm.MoveBatchToDevice()]
    if c.kind == "trainable-fp32":
        # The script converted the whole (trainable) model to half: keep it as loaded.
        return [cm.RemoveModelConversion(from_dtype="float16"), cm.RemoveModelConversion(from_dtype="bfloat16")]
    return []


def _module_params(strategy: str, c: Change, device_type: str) -> tuple[str, dict[str, Any]]:
    if c.kind == "cast-input":
        return "cast-inputs", {"dtype": c.to, "keys": [c.target]} if c.to not in ("int64", "bool") else {"index_keys": [c.target]}
    if c.kind == "convert-model":
        return "half-model", {"dtype": c.to}
    if c.kind == "autocast":
        return ("fp32-trainable" if strategy == "fp32-trainable" else "autocast"), {"dtype": c.to, "device_type": device_type}
    if c.kind == "move-input":
        return "to-device", {"device": c.to}
    return strategy, {}


def write(plan: PatchPlan, path: Path, *, root: Path, force: bool) -> PatchOutcome:
    """Run the codemods and write PATH (and nothing else); or say why nothing could be written."""
    edits, outcomes = [], []
    for file, mods in plan.per_file.items():
        before = read_source(file) if file.exists() else ""
        after, results = cm.run_codemods(before, file.name, mods)
        outcomes += [CodemodOutcome(str(file), r.codemod, r.status, r.detail) for r in results]
        if after != before:
            edits.append((file, before, after))
    if not edits:
        # Nothing to write: say why instead of leaving an empty patch git apply rejects.
        reasons = "; ".join(f"{o.codemod}: {o.detail}" for o in outcomes) or "no edit planned"
        return PatchOutcome(None, (), tuple(outcomes), plan.notes, skipped=reasons)
    patch = make_patch(path, edits, root=root, force=force)
    return PatchOutcome(str(patch.path), tuple(patch.files), tuple(outcomes), plan.notes)


def default_root(*paths: str | Path | None) -> Path:
    for p in paths:
        if p:
            return repo_root(Path(p))
    return repo_root(Path.cwd())
