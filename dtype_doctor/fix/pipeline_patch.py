"""A verified fix of a diffusers pipeline's components, written as lines of the user's loading code.

Each change's strategy says its lines (`Strategy.pipeline_lines`, `{pipe}` for the pipeline's name).
They go into `--script FILE.py` before its pipeline's first call (SetUpPipeline), or, for the
changes no script took, into a new `dtype_doctor_fix.py` whose `apply_fix(pipe)` holds them. Before
anything is written the same lines are run on the pipeline loaded afresh and its step traced again
(`check`); a patch whose lines do not clear the findings is not written.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable, Sequence

from dtype_doctor.fix.outcome import Change, CodemodOutcome, PatchOutcome, Step
from dtype_doctor.fix.patch import make_patch, read_source
from dtype_doctor.fix.patches import default_root
from dtype_doctor.fix.strategies import STRATEGIES, Site, describe

MODULE = "dtype_doctor_fix.py"
# Runs the lines (as `apply_fix(pipe)`) on a freshly loaded pipeline: None when its step is clean, else why not.
Check = Callable[[Callable[[Any], Any]], "str | None"]


def lines_of(changes: Sequence[Change], pipe: str = "pipe") -> list[str]:
    return [line.format(pipe=pipe) for c in changes for line in STRATEGIES[c.kind].pipeline_lines(c)]


def module_text(changes: Sequence[Change], spec: str) -> str:
    said = "\n".join(f"  - {describe(c)}" for c in changes)
    body = textwrap.indent("\n".join(lines_of(changes)), "    ")
    return f'''"""The fix dtype-doctor verified for the diffusers pipeline in {spec}:
{said}

Call it where your code loads the pipeline, before the pipeline's first call:

    pipe = DiffusionPipeline.from_pretrained(...)
    pipe = apply_fix(pipe)
"""

import torch


def apply_fix(pipe):
    """The components' dtypes as dtype-doctor verified them; returns `pipe`, changed in place."""
{body}
    return pipe
'''


def apply_fix_of(changes: Sequence[Change]) -> Callable[[Any], Any]:
    """The module's apply_fix, compiled from the same text the patch writes."""
    namespace: dict[str, Any] = {}
    exec(compile(module_text(changes, "(check)"), MODULE, "exec"), namespace)  # noqa: S102 - our own generated text
    return namespace["apply_fix"]


def write_pipeline_patch(steps: Sequence[Step], spec: str, path: Path, script: Path | None, *, force: bool,
                         check: Check | None = None) -> PatchOutcome:
    changes = [c for s in steps for c in s.changes if STRATEGIES[c.kind].pipeline_lines(c)]
    if not changes:
        return PatchOutcome(None, skipped="no change of the fix is one to a pipeline's loading code")
    problem = check(apply_fix_of(changes)) if check is not None else None
    if problem:
        return PatchOutcome(None, skipped=f"the fix's lines were run on the pipeline loaded afresh and {problem}")
    root = default_root(script)
    edits: list[tuple[Path, str, str]] = []
    outcomes: list[CodemodOutcome] = []
    left = list(changes)
    if script is not None:
        before = text = read_source(script)
        left = []
        for c in changes:
            taken = False
            for attempt in STRATEGIES[c.kind].edits(c, Site(script=script)):
                result = attempt.codemod.apply(text, script.name)
                outcomes.append(CodemodOutcome(str(script), result.codemod, result.status, result.detail))
                if result.applied and result.new_source is not None:
                    text, taken = result.new_source, True
                    break
            if not taken:
                left.append(c)
        edits.append((script, before, text))
    notes: tuple[str, ...] = ()
    if left:
        module = root / MODULE
        if module.exists() and not force:
            return PatchOutcome(None, tuple(), tuple(outcomes), skipped=f"{module} exists; pass --force to replace it")
        edits.append((module, read_source(module) if module.exists() else "", module_text(left, spec)))
        notes = (f"{MODULE}: call pipe = apply_fix(pipe) after loading the pipeline, before its first call",)
    patch = make_patch(path, edits, root=root, force=force)
    return PatchOutcome(str(patch.path), tuple(patch.files), tuple(outcomes), notes)
