"""`dtype-doctor fix --run -- python SCRIPT.py ARGS`: fix the user's own script, as a patch, verified.

    trace   run the script as `run` does; keep its model and the first step's inputs
    fix     the fix engine (apply, re-trace, roll back) on that model and batch; a finding on
            a tensor the step uses outside the model (a loss target) is cast where the
            lineage says its dtype was made
    patch   each change becomes an edit of the user's own files, first where the lineage
            says the offending dtype was made, else at the forward call
    verify  the script runs again, in this process, with the edited text of those files:
            the fix is verified when that run has no finding at or above --fail-on
    write   only a verified patch is written (--write-patch PATH), for `git apply`
"""

from __future__ import annotations

from dataclasses import replace

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from dtype_doctor.errors import UsageError
from dtype_doctor.fix.outcome import Change, FixOutcome, PatchOutcome, Step
from dtype_doctor.fix.patches import Attempt, FileEdits
from dtype_doctor.records import Report, Subject
from dtype_doctor.run.command import ScriptCommand
from dtype_doctor.run.runner import RunOptions, RunResult, run_script
from dtype_doctor.trace.request import TraceRequest
from dtype_doctor.machine.placement import HERE



def fix_script(
    command: ScriptCommand,
    options: RunOptions,
    *,
    strategy: str = "auto",
    fail_on: str = "error",
    unsafe_fixes: bool = False,
    force: bool = False,
    max_rounds: int = 5,
    write_patch: Path | None = None,
) -> Report:
    """Trace the script's step, fix it, express the fix as edits of the user's files, re-run to verify."""
    from dtype_doctor.fix.strategies import NAMES

    if strategy not in NAMES:
        raise UsageError(f"unknown --strategy {strategy!r}; choose one of: {', '.join(NAMES)}")
    if write_patch is not None and write_patch.exists() and not force:
        raise UsageError(f"patch file {write_patch} already exists; pass --force to overwrite it")
    options = dataclasses.replace(options, keep_running=False)
    before = run_script(command, options=options)
    if before.capture is None:  # the load was refused (DD505): the fix is in how the model loads
        steps, result = _fix_load(before.report, strategy=strategy, fail_on=fail_on, unsafe_fixes=unsafe_fixes), None
    else:
        steps, result = _fix_in_memory(before, options, strategy=strategy, fail_on=fail_on, unsafe_fixes=unsafe_fixes,
                                       force=force, max_rounds=max_rounds)
    applied = [s for s in steps if s.status == "applied"]
    if not before.report.at_or_above(fail_on) and not applied:
        return _report(before, strategy, steps, result, True, before.report, None, None, "nothing to fix")
    edits, unexpressed = apply_edits(plan_edits(applied, before, options, command))
    changed = edits.changed
    if not changed:
        why = "; ".join(f"{o.codemod}: {o.detail}" for o in edits.outcomes if o.status != "applied") or "no edit of your files expresses the fix"
        return _report(before, strategy, steps, result, False, None, None, why,
                       "the fix could not be written as an edit of your files")
    after = run_script(command, options=options, sources={str(f): t for f, t in changed.items()})
    verified = not after.report.at_or_above(fail_on) and not (after.report.trace and after.report.trace.failure)
    patch = PatchOutcome(None, tuple(_shown(f) for f in changed), tuple(edits.outcomes))
    skipped = None
    if not verified:
        failing = ", ".join(sorted({f.code for f in after.report.at_or_above(fail_on)})) or "DD001"
        detail = f"the patched script still has findings at or above {fail_on} ({failing}) when run again"
        skipped = "the patch was not verified, so it is not written" if write_patch else None
    else:
        detail = f"verified: the patched script, run again, has no finding at or above {fail_on}"
        if unexpressed:
            detail += f" ({len(unexpressed)} change(s) of the in-memory fix were not needed in your files)"
        if write_patch is not None:
            from dtype_doctor.fix.patch import make_patch, repo_root

            root = repo_root(Path(command.target)) if command.kind == "file" else repo_root(Path.cwd())
            written = make_patch(write_patch, [(f, edits.originals[f], t) for f, t in changed.items()], root=root, force=force)
            patch = PatchOutcome(str(written.path), written.files, tuple(edits.outcomes))
    return _report(before, strategy, steps, result, verified, after.report, patch, skipped, detail)


# ----------------------------------------------------------------------- fix in memory


def _fix_in_memory(before: RunResult, options: RunOptions, **kw: Any) -> tuple[list[Step], Any]:
    """The engine's fix of the model's forward, and the casts of tensors the step uses outside it."""
    from dtype_doctor.fix.engine import fix_model

    capture: Any = before.capture
    report = before.report
    steps: list[Step] = []
    result = None
    inputs = {k: v for k, v in capture.inputs.items()}
    trace = report.trace
    request = TraceRequest(
        # a real step is re-traced where the script put its model; a simulated one on the device the
        # report names, the captured model as the script placed it (a device map is not spread again)
        placement=replace(options.placement, device=report.target.device, gpus=1, device_map=None, max_memory=())
        if options.simulate else HERE,
        autocast=capture.autocast,
        train=report.target.train,
        move_inputs=False,  # the batch stays where the script put it: a stray CPU input is the finding
        select=options.select,
        ignore=options.ignore,
        lineage={k: v for k, v in report.lineage.items() if k in inputs},
        sources={k: v for k, v in (trace.sources if trace else {}).items() if k in inputs},
        subject=Subject(model=report.target.model),
    )
    model_side = any(_is_model_input(f, inputs) for f in report.at_or_above(kw["fail_on"]))
    if model_side:
        result = fix_model(capture.model, inputs, request, measure=not options.simulate, **kw)
        steps.extend(result.steps)
    outside = _outside_changes(report, inputs, kw["fail_on"])
    if outside:
        steps.append(Step("cast-inputs", "applied", "; ".join(f"cast {c.target} {c.before} → {c.to} where it is made" for c in outside), tuple(outside)))
    return steps, result


def _fix_load(report: Report, *, strategy: str, fail_on: str, unsafe_fixes: bool) -> list[Step]:
    """A model transformers refused to load has no step to fix in memory: each strategy a finding
    names as a remedy plans its change from the report, and the re-run of the script verifies it."""
    from dtype_doctor.fix.strategies import STRATEGIES, Context

    ctx = Context(fail_on=fail_on, unsafe=unsafe_fixes or strategy != "auto", requested=None if strategy == "auto" else strategy)
    steps: list[Step] = []
    for s in STRATEGIES.values():
        if (strategy != "auto" and s.name != strategy) or not s.remedies(report, ctx):
            continue
        try:
            changes = s.planned(None, report, ctx)  # no model was loaded
        except Exception as exc:  # noqa: BLE001 - a strategy that needs the model cannot fix a refused load
            steps.append(Step(s.name, "skipped", f"needs the loaded model ({type(exc).__name__})"))
            continue
        steps.append(changes if isinstance(changes, Step) else s.applied(changes))
    return steps


def _is_model_input(finding: Any, inputs: Mapping[str, Any]) -> bool:
    """A finding the engine can reproduce on the model and batch alone (not a loss target's)."""
    targets = [r.target for r in finding.remedies if r.strategy in ("cast-inputs", "to-device")]
    return not targets or any(t in inputs or not _is_name(t) for t in targets)


def _is_name(target: str) -> bool:
    return ":" not in target and "@" not in target


def _outside_changes(report: Report, inputs: Mapping[str, Any], fail_on: str) -> list[Change]:
    """Casts for the tensors the step uses outside the model (named by the run, e.g. a loss target)."""
    changes: dict[str, Change] = {}
    for f in report.at_or_above(fail_on):
        for r in f.remedies:
            if r.strategy != "cast-inputs" or r.target in inputs or not _is_name(r.target) or r.target in changes:
                continue
            now = next((t.dtype for t in f.tensors if t.origin == f"input:{r.target}"), None)
            source = r.source or (report.trace.sources.get(r.target) if report.trace else None)
            changes[r.target] = Change("cast-inputs", r.target, r.to, now, r.stage, source)
    return list(changes.values())


# ----------------------------------------------------------------------------- edits


def plan_edits(applied: list[Step], before: RunResult, options: RunOptions, command: ScriptCommand) -> list[tuple[Change, str, list[Attempt]]]:
    """Each applied change → the edits its strategy tries in order: where its dtype was made,
    then at the forward."""
    from dtype_doctor.fix.strategies import STRATEGIES, Site
    from dtype_doctor.fix.strategies.base import resolve

    capture: Any = before.capture
    if capture is None:  # a refused load: the script is where its config is
        site = Site(script=Path(command.target) if command.kind == "file" else None, run=True)
        return [(c, step.strategy, STRATEGIES[c.kind].edits(c, site)) for step in applied for c in step.changes]
    call = resolve(capture.call_site)
    conversion = _last_conversion(capture)
    site = Site(
        device_type=(before.report.target.device or "cpu").split(":")[0],
        model_dtype=before.report.target.model_dtype,
        script=Path(command.target) if command.kind == "file" else call,
        run=True,
        call=call,
        call_line=capture.call_site.line if capture.call_site else None,
        positions=_positions(capture),
        step_inputs=frozenset(capture.inputs),
        converted=conversion is not None,
        conversion=conversion.source if conversion else None,
    )
    return [(c, step.strategy, STRATEGIES[c.kind].edits(c, site)) for step in applied for c in step.changes]


def _positions(capture: Any) -> dict[str, int]:
    """Input name → its position in the model call, for inputs passed positionally."""
    import inspect

    try:
        params = list(inspect.signature(capture.model.forward).parameters)
    except (TypeError, ValueError):
        return {}
    return {name: params.index(name) for name in capture.inputs if name in params}


def _last_conversion(capture: Any) -> Any:
    """The script's last dtype conversion of its model (`model.half()`), if it made one."""
    events = [e for e in capture.conversions.of(capture.model) if e.dtype is not None]
    return events[-1] if events else None


def apply_edits(plans: list[tuple[Change, str, list[Attempt]]]) -> tuple[FileEdits, list[Change]]:
    """Try each change's edits in order, in memory; the first that applies wins. Also the
    changes no codemod could write."""
    edits = FileEdits(_shown)
    return edits, [change for change, _strategy, attempts in plans if not edits.first_that_applies(attempts)]


def _shown(file: Path) -> str:
    from dtype_doctor.machine.user_code import display_path

    return display_path(str(file))


# ---------------------------------------------------------------------------- report


def _report(before: RunResult, strategy: str, steps: list[Step], result: Any, verified: bool, after: Report | None,
             patch: PatchOutcome | None, skipped: str | None, detail: str) -> Report:
    after = after or (result.after if result is not None else before.report)
    outcome = FixOutcome(
        strategy=strategy,
        steps=tuple(steps),
        verified=verified,
        after_findings=after.findings,
        after_summary=after.summary,
        converged=result.converged if result is not None else True,
        rounds=result.rounds if result is not None else (1 if steps else 0),
        detail=detail,
        parity=result.parity if result is not None else None,
        cost=result.cost if result is not None else None,
        tradeoff=result.tradeoff if result is not None else None,
        patch=patch,
        patch_skipped=skipped,
    )
    return dataclasses.replace(before.report, fix=outcome)

