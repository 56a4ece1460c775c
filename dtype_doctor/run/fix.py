"""`dtype-doctor fix --run -- python SCRIPT.py ARGS`: the one loop that fixes the user's own script.

    run      the script runs as `run` runs it, under the one placement its options decide
    plan     each finding at or above --fail-on gets the edits of its remedies' strategies, in
             auto's order (each strategy owns its edits: where the finding's lines say, in the
             script or any module of the user's it imports)
    write    each finding's first edit that applies is made, in memory
    re-run   the script runs again with the edited texts, under the same options
    compare  the same findings, before and after: an edit whose finding is gone is verified and
             kept; one whose finding stays is taken back (shown as a diff, with what the re-run
             said) and the finding's next edit is tried; a finding new in the re-run is named,
             with why it appeared, and planned in turn
    run on   once the kept edits cure the step, the patched script runs again past it, through its
             evaluation and checkpoint code, to its end (or --horizon): verified means the script
             runs. An edit after which it fails is taken back and the finding's next edit tried; when
             none does better the patch keeps it and says where the script then fails (not verified)
    patch    every verified edit is written (--write-patch), whatever remains; what remains is
             listed with its reason

Each step hands the next a small frozen record (Planned, Candidate, Written, Compared). The
user's files are never changed: the re-runs read the edited texts in place of the files, and
the patch is the only file written. An edit that makes the script raise where it did not is the
doctor's failure (EditBrokeScript, exit 3, with the edit), never the user's.
"""

from __future__ import annotations


import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dtype_doctor.records.errors import DoctorError, InputError, UsageError
from dtype_doctor.fix.outcome import Change, CodemodOutcome, FixOutcome, Leftover, PatchOutcome, RejectedEdit, Step
from dtype_doctor.fix.patches import Attempt, FileEdits
from dtype_doctor.fix.settings import FixSettings
from dtype_doctor.records import Finding, Report
from dtype_doctor.run.command import ScriptCommand
from dtype_doctor.run.runner import RunOptions, RunResult, run_script

Key = tuple[str, str, tuple[str, ...]]


class EditBrokeScript(DoctorError):
    """An edit of the doctor's made the script raise where it ran before: the doctor's failure."""

    exit_code = 3

    def __init__(self, message: str, diff: str) -> None:
        super().__init__(message)
        self.diff = diff


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Candidate:
    """One way to fix one finding: a strategy's change and the codemod that writes it."""

    strategy: str
    change: Change
    attempt: Attempt

    @property
    def identity(self) -> tuple:
        """The same edit planned for two findings is one edit: the file and what the codemod holds."""
        return (self.attempt.file, _signature(self.attempt.codemod))


@dataclass(frozen=True)
class Planned:
    """A finding to fix, its candidates in the order to try them, and the strategies that offer none (why)."""

    key: Key
    finding: Finding
    candidates: tuple[Candidate, ...]
    skipped: tuple[Step, ...] = ()
    new_because: str | None = None  # a finding the first run did not have: why it appeared


@dataclass(frozen=True)
class Written:
    """One round's edits, in memory: the texts and which candidate each finding took."""

    texts: Mapping[Path, str]  # the files changed, and their new text
    originals: Mapping[Path, str]
    taken: Mapping[Key, Candidate]  # the findings tried this round, and the edit each took
    kept: Mapping[Key, Candidate]  # the edits verified in earlier rounds, made again
    outcomes: tuple[CodemodOutcome, ...]


@dataclass(frozen=True)
class Compared:
    """The same findings, before and after: those gone, those still there, and those new."""

    gone: frozenset[Key]
    still: frozenset[Key]
    new: tuple[Finding, ...]


def finding_key(f: Finding) -> Key:
    """What makes a finding the same finding in two runs: its rule, module and what its remedies
    change (messages carry counts that change: "41 trainable parameters ...")."""
    targets = tuple(sorted({r.target for r in f.remedies})) or ((f.op or ""),)
    return (f.code, f.module, targets)


# ------------------------------------------------------------------------------- loop


def fix_script(
    command: ScriptCommand,
    options: RunOptions,
    *,
    settings: FixSettings | None = None,
    write_patch: Path | None = None,
    **fixing: Any,
) -> Report:
    """Run the script, plan edits from its findings' remedies, write them in memory, run it again
    under the same options, keep the edits that verified, and write them (--write-patch).
    `settings`, or its fields as keywords (strategy=, fail_on=, ...)."""
    settings = FixSettings.of(settings, fixing)
    if fixing:
        raise TypeError(f"fix_script() got unexpected keyword argument(s): {', '.join(fixing)}")
    strategy, fail_on, unsafe_fixes, force, max_rounds = (settings.strategy, settings.fail_on, settings.unsafe_fixes,
                                                          settings.force, settings.max_rounds)
    if write_patch is not None and write_patch.exists() and not force:
        raise UsageError(f"patch file {write_patch} already exists; pass --force to overwrite it")
    options = dataclasses.replace(options, keep_running=False)  # one placement, for every run below
    before = run_script(command, options=options)
    report = before.report
    if not report.at_or_above(fail_on):
        return _report(before, strategy, [], True, report, 0, "nothing to fix")
    site = script_site(before, command)
    plans = {p.key: p for p in plan_fixes(report, site, strategy=strategy, fail_on=fail_on, unsafe_fixes=unsafe_fixes)}
    loop = _Loop(command, options, fail_on, before, site, plans, strategy=strategy, unsafe_fixes=unsafe_fixes)
    after = loop.run_on(loop.run(max_rounds))
    while loop.script_failed is not None and loop.retry(max_rounds):
        after = loop.run_on(loop.run(max_rounds))  # the next edit of each finding whose edit cured only the step
    if loop.script_failed is None and loop.restore():
        # No other edit did better than one that cures only the step: the patch holds it, and says so (not verified).
        after = loop.run_on(after, restored=True)
    return loop.outcome(after, strategy, write_patch, force)


def plan_fixes(report: Report, site: Any, *, strategy: str = "auto", fail_on: str = "error", unsafe_fixes: bool = False,
               findings: tuple[Finding, ...] | None = None, new_because: str | None = None) -> list[Planned]:
    """Each finding at or above `fail_on` (or `findings`): the edits its remedies' strategies offer,
    in auto's order (only `strategy`'s when one is named)."""
    from dtype_doctor.fix.strategies import STRATEGIES, Context

    ctx = Context(fail_on=fail_on, unsafe=unsafe_fixes or strategy != "auto", requested=None if strategy == "auto" else strategy)
    plans: dict[Key, Planned] = {}
    for f in findings if findings is not None else report.at_or_above(fail_on):
        key = finding_key(f)
        if key in plans:
            continue
        offered = {r.strategy for r in f.remedies}
        candidates: list[Candidate] = []
        skipped: list[Step] = []
        for s in STRATEGIES.values():  # auto's order: least invasive first
            if s.name not in offered or (strategy != "auto" and s.name != strategy):
                continue
            changes = s.scripted(f, report, ctx)
            if isinstance(changes, Step):
                skipped.append(changes)
                continue
            for c in changes:
                attempts = s.edits(c, site)
                if not attempts:
                    skipped.append(Step(s.name, "skipped", f"{s.describe(c)}: no edit of your files can hold it"))
                candidates += [Candidate(s.name, c, a) for a in attempts]
        if not offered:
            skipped.append(Step("auto", "skipped", f"{f.code} names no fix a strategy applies"))
        elif strategy != "auto" and strategy not in offered:
            skipped.append(Step(strategy, "skipped", f"{f.code} is not fixed by {strategy} (it offers {', '.join(sorted(offered))})"))
        plans[key] = Planned(key, f, tuple(candidates), tuple(skipped), new_because)
    return list(plans.values())


class _Loop:
    """The rounds of write, re-run, compare; what each finding took, and what the re-runs said."""

    def __init__(self, command: ScriptCommand, options: RunOptions, fail_on: str, before: RunResult, site: Any,
                 plans: dict[Key, Planned], *, strategy: str = "auto", unsafe_fixes: bool = False) -> None:
        self.command, self.options, self.fail_on, self.before, self.site = command, options, fail_on, before, site
        self.strategy, self.unsafe_fixes = strategy, unsafe_fixes
        self.plans = plans
        self.position = {k: 0 for k in plans}
        self.kept: dict[Key, Candidate] = {}
        self.fixed_by: dict[Key, str] = {}  # a finding gone with another finding's edit
        self.rejected: list[RejectedEdit] = []
        self.not_written: dict[Key, list[str]] = {}  # each finding's edits that did not apply, and why
        self.tried: dict[Key, int] = {}  # each finding's edits written and run, that the re-run did not verify
        self.steps: list[Step] = [s for p in plans.values() for s in p.skipped]
        # Each edit's latest outcome, by the edit's identity: an edit made again in a later round, its
        # line moved by another edit, is the same edit (listed once, as the patch has it).
        self.outcomes: dict[tuple, CodemodOutcome] = {}
        self.rounds = 0
        self.last: Written | None = None
        self.script_failed: str | None = None  # the patched script, run on past the step, failed: where and with what
        self.ran_on: str | None = None  # how far the patched script ran past the step without failing
        self.step_only: dict[Key, Candidate] = {}  # edits that cured the traced step, after which the script failed

    def run(self, max_rounds: int) -> RunResult:
        after = self.before
        while self.rounds < max_rounds:
            written = self._write()
            if written is None:
                break
            self.rounds += 1
            try:
                after = self._rerun(written)
            except EditBrokeScript as exc:
                if not self.step_only:
                    raise
                self._broke_on_retry(written, str(exc))  # an edit tried after one that cured only the step
                continue
            compared = self._compare(after)
            self._judge(written, compared, after)
            self._plan_new(compared, written, after.report)
            self.last = written
        if self.last is not None and any(k not in self.kept for k in self.last.taken):
            # The last round carried edits the re-run rejected: the patch is what is kept, run once more.
            final = self._write(only_kept=True)
            after = self._rerun(final) if final is not None else self.before
            self.last = final
        return after

    def _broke_on_retry(self, written: Written, said: str) -> None:
        from dtype_doctor.fix.strategies import describe

        for key, cand in written.taken.items():
            self.rejected.append(RejectedEdit(cand.strategy, _shown(cand.attempt.file), cand.attempt.codemod.name, _alone(cand, written), said))
            self.steps.append(Step(cand.strategy, "failed", f"{describe(cand.change)}: {said}", (cand.change,)))
            self.position[key] += 1

    def restore(self) -> bool:
        """The edits that cured only the step, for findings no later edit fixed: kept again (the patch holds them)."""
        from dtype_doctor.fix.strategies import describe

        back = {k: c for k, c in self.step_only.items() if k not in self.kept and k not in self.fixed_by}
        for key, cand in back.items():
            self.kept[key] = cand
            self.steps = [s for s in self.steps if not (s.status == "failed" and s.changes == (cand.change,) and "cures the traced step" in s.detail)]
            self.steps.append(Step(cand.strategy, "applied", f"{describe(cand.change)}: cures the traced step only", (cand.change,)))
            self.rejected = [r for r in self.rejected if not (r.codemod == cand.attempt.codemod.name and "cures the traced step" in r.rerun)]
        return bool(back)

    def run_on(self, after: RunResult, *, restored: bool = False) -> RunResult:
        """A step the kept edits cured: the patched script runs again past it, through its evaluation and
        checkpoint code, to its end (or --horizon seconds on). Verified means the script runs, not the step:
        a script that then fails is not fixed. A simulated run stays simulated and writes none of your files."""
        failure = after.report.trace.failure if after.report.trace else None
        if not self.kept or (not restored and (after.report.at_or_above(self.fail_on) or failure is not None)):
            return after
        final = self._write(only_kept=True)
        if final is None:
            return after
        on = dataclasses.replace(self.options, keep_running=True)
        result = self._rerun(final, on)
        self.last = final
        error = result.outcome.error
        if error is not None:
            from dtype_doctor.records.errors import first_line
            from dtype_doctor.run.runner import user_frame

            self.script_failed = f"{_as_written(user_frame(error), final) or ' in it'} with {type(error).__name__}: {first_line(error)}"
        else:
            self.ran_on = _how_far(result.outcome.stop, on)
        return result

    def retry(self, max_rounds: int) -> bool:
        """The patched script failed past the step: each kept edit its finding has another edit for is
        taken back (rejected, with where the script failed) and the next one is tried. False when none has."""
        from dtype_doctor.fix.strategies import describe

        again = [k for k in self.kept if self.position[k] + 1 < len(self.plans[k].candidates)]
        if not again or self.rounds >= max_rounds or self.last is None:
            return False
        said = f"it cures the traced step; the script then fails{self.script_failed}"
        rejected: set[tuple] = set()
        for key in again:
            cand = self.step_only[key] = self.kept.pop(key)
            self.steps = [s for s in self.steps if not (s.status == "applied" and s.changes == (cand.change,))]
            if cand.identity not in rejected:
                rejected.add(cand.identity)
                self.rejected.append(RejectedEdit(cand.strategy, _shown(cand.attempt.file), cand.attempt.codemod.name, _alone(cand, self.last), said))
                self.steps.append(Step(cand.strategy, "failed", f"{describe(cand.change)}: {said}", (cand.change,)))
            self.position[key] += 1
        self.script_failed = None
        return True

    # -- write

    def _write(self, *, only_kept: bool = False) -> Written | None:
        """The kept edits again, and for each open finding its next candidate that applies."""
        from dtype_doctor.machine.user_code import display_path

        edits = FileEdits(lambda f: display_path(str(f)))
        made: dict[tuple, Candidate] = {}
        tried: list[tuple] = []  # the identity of each edit tried, as edits.outcomes has its outcome

        def applies(cand: Candidate) -> bool:
            tried.append(cand.identity)
            return edits.first_that_applies([cand.attempt])

        for cand in self.kept.values():
            if cand.identity not in made and applies(cand):
                made[cand.identity] = cand
        taken: dict[Key, Candidate] = {}
        waits = self._waiting()
        for key, plan in ([] if only_kept else sorted(self.plans.items(), key=lambda kp: not _at_entry(kp[1]))):
            if key in self.kept or key in self.fixed_by or key in waits or _after_entry(plan, taken, self.plans):
                continue
            while self.position[key] < len(plan.candidates):
                cand = plan.candidates[self.position[key]]
                if cand.identity in made:  # the same edit another finding took: one edit for both
                    taken[key] = cand
                    break
                if applies(cand):
                    made[cand.identity] = taken[key] = cand
                    break
                o = edits.outcomes[-1]
                self.not_written.setdefault(key, []).append(f"{o.codemod}: {o.detail}")
                self.position[key] += 1
        for identity, o in zip(tried, edits.outcomes):
            self.outcomes[identity] = o
        if not taken and not only_kept:
            return None
        if only_kept and not made:
            return None
        kept = {k: c for k, c in self.kept.items()}
        return Written(edits.changed, dict(edits.originals), taken, kept, tuple(edits.outcomes))

    def _waiting(self) -> set[Key]:
        """The findings inside a module another open finding's edit changes whole (a DD101 at unet.conv_in
        while DD801's `pipe.unet.to(torch.float32)` is untried): they wait a round, as that edit may clear
        them too; an edit of their own first (autocast around the pipeline call) would undo it."""
        wholes = {p.finding.module: k for k, p in self.plans.items()
                  if p.finding.module and k not in self.kept and k not in self.fixed_by
                  and self.position[k] < len(p.candidates) and any(r.target == p.finding.module for r in p.finding.remedies)}
        return {k for k, p in self.plans.items()
                if any(k != w and (p.finding.module or "").startswith(m + ".") for m, w in wholes.items())}

    # -- re-run

    def _rerun(self, written: Written, options: RunOptions | None = None) -> RunResult:
        """The script with the edited texts, under the same options; an edit that makes it raise
        where it ran before is the doctor's failure."""
        try:
            after = run_script(self.command, options=options or self.options, sources={str(f): t for f, t in written.texts.items()})
        except InputError as exc:
            cause = exc.__cause__
            if cause is None:
                raise self._broke(written, str(exc)) from exc
            from dtype_doctor.records.errors import first_line
            from dtype_doctor.run.runner import user_frame

            raise self._broke(written, f"{type(cause).__name__}: {first_line(cause)}{user_frame(cause)}") from exc
        failure = after.report.trace.failure if after.report.trace else None
        before_failure = self.before.report.trace.failure if self.before.report.trace else None
        if failure is not None and before_failure is None and _at_edit(failure, written):
            raise self._broke(written, failure.message)
        return after

    def _broke(self, written: Written, said: str) -> EditBrokeScript:
        diff = _diff(written)
        first = next((o for o in written.outcomes if o.status == "applied"), None)
        edit = f" ({first.codemod} on {first.file}: {first.detail})" if first else ""
        return EditBrokeScript(f"the doctor's own edit broke the script{edit}: run with it, the script raised {said}", diff)

    # -- compare

    def _compare(self, after: RunResult) -> Compared:
        before = {finding_key(f) for f in self.before.report.at_or_above(self.fail_on)} | set(self.plans)
        now = {finding_key(f): f for f in after.report.at_or_above(self.fail_on)}
        keys = set(self.plans)
        new = tuple(f for k, f in now.items() if k not in before)
        return Compared(frozenset(keys - set(now)), frozenset(keys & set(now)), new)

    def _judge(self, written: Written, compared: Compared, after: RunResult) -> None:
        from dtype_doctor.fix.strategies import describe

        # One edit two findings took is one edit: listed once, applied or rejected.
        applied: set[tuple] = set()
        rejected: set[tuple] = set()
        for key, cand in written.taken.items():
            if key in compared.gone:
                self.kept[key] = cand
                if cand.identity not in applied:
                    applied.add(cand.identity)
                    self.steps.append(Step(cand.strategy, "applied", f"{describe(cand.change)}: {_applied_detail(written, cand)}", (cand.change,)))
                continue
            said = _still(self.plans[key].finding, after, self.fail_on)
            if cand.identity not in rejected:
                rejected.add(cand.identity)
                self.rejected.append(RejectedEdit(cand.strategy, _shown(cand.attempt.file), cand.attempt.codemod.name,
                                                  _alone(cand, written), said))
                self.steps.append(Step(cand.strategy, "failed", f"{describe(cand.change)}: written and run again, and {said}", (cand.change,)))
            self.tried[key] = self.tried.get(key, 0) + 1
            self.position[key] += 1
        for key in compared.gone:
            if key not in written.taken and key not in self.kept:
                self.fixed_by[key] = "gone with the other edits"

    def _plan_new(self, compared: Compared, written: Written, report: Report) -> None:
        if not compared.new:
            return
        from dtype_doctor.fix.strategies import describe

        stopped = self.before.report.trace.coverage.stopped if self.before.report.trace and self.before.report.trace.coverage else None
        edits = "; ".join(describe(c.change) for c in (*written.kept.values(), *written.taken.values()))
        why = (f"the first run stopped early ({stopped}); with the edits the step went on and met it" if stopped
               else f"it appeared with the edits ({edits})")
        for plan in plan_fixes(report, self.site, strategy=self.strategy, fail_on=self.fail_on, unsafe_fixes=self.unsafe_fixes,
                               findings=compared.new, new_because=why):
            if plan.key not in self.plans:
                self.plans[plan.key] = plan
                self.position[plan.key] = 0
                self.steps += plan.skipped

    # -- the outcome

    def outcome(self, after: RunResult, strategy: str, write_patch: Path | None, force: bool) -> Report:
        from dtype_doctor.machine.user_code import display_path

        fail_on = self.fail_on
        left = {finding_key(f): f for f in after.report.at_or_above(fail_on)}
        failure = after.report.trace.failure if after.report.trace else None
        verified = not left and failure is None and self.script_failed is None
        remaining = tuple(_leftover(f, self._why(k)) for k, f in left.items() if not self.plans.get(k) or not self.plans[k].new_because)
        new = tuple(_leftover(f, self.plans[k].new_because or "") for k, f in left.items() if self.plans.get(k) and self.plans[k].new_because)
        patch, skipped = None, None
        written = self.last
        edits = tuple(self.outcomes.values())
        if written is not None and written.texts and self.kept:
            files = tuple(display_path(str(f)) for f in written.texts)
            patch = PatchOutcome(None, files, edits)
            if write_patch is not None:
                from dtype_doctor.fix.patch import make_patch, repo_root

                root = repo_root(Path(self.command.target)) if self.command.kind == "file" else repo_root(Path.cwd())
                made = make_patch(write_patch, [(f, written.originals[f], t) for f, t in written.texts.items()], root=root, force=force)
                # What remains is not a verified change the patch leaves out (PatchOutcome.unwritten): it is
                # listed as remaining, each with its reason, and fix exits 1 on it.
                patch = PatchOutcome(str(made.path), made.files, edits)
        elif write_patch is not None:
            skipped = "no edit of your files was verified: " + ("; ".join(leftover.said for leftover in (*remaining, *new)) or "nothing to write")
        fixed = len(self.kept) + len(self.fixed_by)
        if verified:
            detail = f"verified: the script, run again with the edits, has no finding at or above {fail_on}"
        elif fixed:
            detail = (f"{fixed} of {len(self.plans)} finding(s) fixed and verified by running the script again; "
                      f"{len(left)} remain at or above {fail_on}")
        else:
            detail = "no edit of your files fixed a finding (each is listed under remaining, with why)"
        if failure is not None and not left:
            detail = f"the script, run again with the edits, stopped: {failure.message}"
        if self.script_failed is not None:
            detail = f"cures the traced step; the script then fails{self.script_failed}"
        outcome = _report(self.before, strategy, self.steps, verified, after.report, self.rounds, detail, patch, skipped, remaining, new,
                          tuple(self.rejected))
        assert outcome.fix is not None
        return dataclasses.replace(outcome, fix=dataclasses.replace(outcome.fix, script_failed=self.script_failed, ran_on=self.ran_on))

    def _why(self, key: Key) -> str:
        """Why a finding the first run had is still there: what became of each of its edits."""
        plan = self.plans.get(key)
        if plan is None:
            return "no strategy offers a fix for it"
        reasons = [s.detail for s in plan.skipped] + self.not_written.get(key, [])
        if self.tried.get(key):
            reasons.insert(0, f"{self.tried[key]} edit(s) written and run again, and the finding stayed (see rejected)")
            return "; ".join(dict.fromkeys(reasons))
        if not reasons:
            reasons.append("no strategy offers an edit of your files for it")
        return "no edit of your files expresses it: " + "; ".join(dict.fromkeys(reasons))


# ------------------------------------------------------------------------------- site


def script_site(before: RunResult, command: ScriptCommand) -> Any:
    """Where the fix's edits can land: the script, the file of the model call, the lines the run
    saw (conversions, the last line that handled each input), and the target GPU."""
    from dtype_doctor.fix.strategies import Site
    from dtype_doctor.fix.strategies.base import resolve

    script = Path(command.target) if command.kind == "file" else None
    capture: Any = before.capture
    trace = before.report.trace
    capability = trace.gpu_capability if trace else None
    bf16 = capability >= (8, 0) if capability else _real_bf16()
    if capture is None:  # a refused load: the script is where its config is
        return Site(script=script, run=True, bf16=bf16)
    call = resolve(capture.call_site)
    conversion = _last_conversion(capture)
    return Site(
        device_type=(before.report.target.device or "cpu").split(":")[0],
        model_dtype=before.report.target.model_dtype,
        script=script or call,
        run=True,
        call=call,
        call_line=capture.call_site.line if capture.call_site else None,
        model_name=capture.bound.model_name,
        positions=_positions(capture),
        step_inputs=frozenset(capture.inputs),
        converted=conversion is not None,
        conversion=conversion.source if conversion else None,
        handled=dict(capture.handled),
        bf16=bf16,
        model_class=type(capture.model).__name__,
    )


def _real_bf16() -> bool | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability() >= (8, 0)


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


# ----------------------------------------------------------------------------- helpers


def _at_entry(plan: Planned) -> frozenset[str]:
    from dtype_doctor.fix.strategies import at_entry

    return at_entry(plan.finding)


def _after_entry(plan: Planned, taken: Mapping[Key, Candidate], plans: Mapping[Key, Planned]) -> bool:
    """A finding on an input whose fix where it enters the script was taken this round (fix.strategies.at_entry,
    tried first): it waits a round, as that edit may clear it too."""
    entered = {t for k in taken for t in _at_entry(plans[k])}
    return not _at_entry(plan) and bool(entered & {r.target for r in plan.finding.remedies})


def _signature(codemod: Any) -> tuple:
    from dtype_doctor.fix.codemods import AllOf

    if isinstance(codemod, AllOf):
        return ("AllOf", tuple(_signature(c) for c in codemod.codemods))
    return (type(codemod).__name__, tuple(sorted((k, repr(v)) for k, v in vars(codemod).items())))


def _shown(file: Path) -> str:
    from dtype_doctor.machine.user_code import display_path

    return display_path(str(file))


def _diff(written: Written) -> str:
    out = []
    for f, text in written.texts.items():
        name = _shown(f)
        out += difflib.unified_diff(written.originals[f].splitlines(keepends=True), text.splitlines(keepends=True), f"a/{name}", f"b/{name}")
    return "".join(out)


def _alone(cand: Candidate, written: Written) -> str:
    """The diff of one edit alone, on the file as the user has it."""
    original = written.originals.get(cand.attempt.file)
    if original is None:
        return ""
    result = cand.attempt.codemod.apply(original, cand.attempt.file.name)
    if not result.applied or result.new_source is None:
        return ""
    name = _shown(cand.attempt.file)
    return "".join(difflib.unified_diff(original.splitlines(keepends=True), result.new_source.splitlines(keepends=True), f"a/{name}", f"b/{name}"))


def _applied_detail(written: Written, cand: Candidate) -> str:
    name = _shown(cand.attempt.file)
    found = next((o for o in written.outcomes if o.codemod == cand.attempt.codemod.name and o.file == name and o.status == "applied"), None)
    return found.detail if found else f"{cand.attempt.codemod.name} on {name}"


def _still(finding: Finding, after: RunResult, fail_on: str) -> str:
    key = finding_key(finding)
    same = next((f for f in after.report.at_or_above(fail_on) if finding_key(f) == key), finding)
    return f"{same.code} is still reported: {same.message}"


def _at_edit(failure: Any, written: Written) -> bool:
    """Whether the re-run's trace stopped in an edited file (where the doctor's edit runs)."""
    text = getattr(failure, "message", "") or ""
    return any(_shown(f) in text or f.name in text for f in written.texts)


def _how_far(stop: BaseException | None, options: RunOptions) -> str:
    """How far the patched script ran past the step without an error: to its end, its --horizon, or
    as far as a simulation can follow it (a value no simulated tensor holds)."""
    from dtype_doctor.machine.control import HorizonReached
    from dtype_doctor.machine.simulate import SimulationStop

    if isinstance(stop, HorizonReached):
        return f"for {options.horizon:g} s past the step (--horizon)"
    if isinstance(stop, SimulationStop):
        why = f"{stop.limit} has no fake implementation" if stop.limit else f"{stop.what} needs a value"
        return f"to {stop.where}, as far as the simulation can follow it ({why})"
    if stop is not None and options.simulate:  # the doctor's StopScript: a simulated script goes no further
        return "to its model's next call after the traced step, where a simulated script stops (its tensors hold no data)"
    return "to its end"


def _as_written(where: str, written: Written) -> str:
    """" at train.py:53" of the patched text, as the line of the file the user has (the patch adds lines above it)."""
    name, _, line = where.removeprefix(" at ").rpartition(":")
    file = next((f for f in written.texts if _shown(f) == name), None)
    if file is None or not line.isdigit():
        return where
    matcher = difflib.SequenceMatcher(None, written.originals[file].splitlines(), written.texts[file].splitlines(), autojunk=False)
    at = int(line) - 1
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if j1 <= at < j2 and tag == "equal":
            return f" at {name}:{i1 + at - j1 + 1}"
    return where  # a line the patch wrote: as it is in the patch


def _leftover(f: Finding, why: str) -> Leftover:
    return Leftover(f.code, f.message, f.source, why)


def _report(before: RunResult, strategy: str, steps: list[Step], verified: bool, after: Report, rounds: int, detail: str,
            patch: PatchOutcome | None = None, skipped: str | None = None, remaining: tuple[Leftover, ...] = (),
            new: tuple[Leftover, ...] = (), rejected: tuple[RejectedEdit, ...] = ()) -> Report:
    # One line for what several findings said alike (each DD101 of a UNet cast alone: "names no fix").
    said = {(s.strategy, s.status, s.detail): s for s in steps}
    outcome = FixOutcome(
        strategy=strategy,
        steps=tuple(said.values()),
        verified=verified,
        after_findings=after.findings,
        after_summary=after.summary,
        converged=verified or not any(s.status == "failed" for s in steps),
        rounds=rounds,
        detail=detail,
        patch=patch,
        patch_skipped=skipped,
        remaining=remaining,
        new=new,
        rejected=rejected,
    )
    return dataclasses.replace(before.report, fix=outcome)


__all__ = ["Candidate", "Compared", "EditBrokeScript", "Planned", "Written", "finding_key", "fix_script", "plan_fixes", "script_site"]
