"""The fix loop, as linters run theirs: apply, re-trace, re-check, repeat up to a cap.

A strategy whose re-trace is not better than before is rolled back; a loop that ends
with findings still at or above --fail-on says so ("failed to converge" when it was
still making progress at the cap). Every outcome is a value in FixResult.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import torch

from dtype_doctor.records.errors import is_out_of_memory
from dtype_doctor.fix.outcome import Alternative, Cost, FixOutcome, Parity, PatchOutcome, Peak, Step, Tradeoff
from dtype_doctor.fix.settings import FixSettings
from dtype_doctor.fix.strategies import AUTO_ORDER, STRATEGIES, UNSAFE, Context, Pipeline, convert_keeping_fp32
from dtype_doctor.records import FP16_MAX, Report
from dtype_doctor.diagnosis import as_request, diagnose
from dtype_doctor.trace.engine import settle
from dtype_doctor.numerics import dtype_name, forward, fp32_inputs, fp32_reference, module_peaks, output_diff, weight_bytes
from dtype_doctor.trace.request import TraceRequest

T = TypeVar("T")


@dataclass(frozen=True)
class FixResult:
    strategy: str
    steps: tuple[Step, ...]
    verified: bool
    converged: bool
    rounds: int
    detail: str
    before: Report
    after: Report
    pipeline: Pipeline  # the fixed pipeline (model, inputs, autocast) — not a copy of the user's
    parity: Parity | None
    cost: Cost | None
    tradeoff: Tradeoff | None

    @property
    def applied(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.status == "applied")

    def outcome(self, patch: PatchOutcome | None = None, patch_skipped: str | None = None) -> FixOutcome:
        """The `fix` block (docs/report.md) of the report, as a record."""
        return FixOutcome(
            strategy=self.strategy, steps=self.steps, verified=self.verified,
            after_findings=self.after.findings, after_summary=self.after.summary,
            converged=self.converged, rounds=self.rounds, detail=self.detail,
            parity=self.parity, cost=self.cost, tradeoff=self.tradeoff,
            patch=patch, patch_skipped=patch_skipped or (patch.skipped if patch else None),
        )

    def report(self, patch: PatchOutcome | None = None, patch_skipped: str | None = None) -> Report:
        """The scan report of the original pipeline with the fix outcome attached."""
        return Report(
            findings=self.before.findings,
            target=self.before.target,
            environment=self.before.environment,
            trace=self.before.trace,
            fix=self.outcome(patch, patch_skipped),
        )


def _score(report: Report, fail_on: str) -> int:
    failing = len(report.at_or_above(fail_on))
    return failing + (100 if report.trace and report.trace.failure else 0)


@dataclass(frozen=True)
class _Rounds:
    """Where the apply / re-trace loop ended: the pipeline and its report, every step tried, and
    whether the last round still made progress (at the cap: failed to converge)."""

    current: Pipeline
    report: Report
    steps: tuple[Step, ...]
    rounds: int
    progressing: bool


@dataclass(frozen=True)
class _Measured:
    parity: Parity | None = None
    cost: Cost | None = None
    tradeoff: Tradeoff | None = None


def fix_model(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    request: TraceRequest | None = None,
    *,
    settings: FixSettings | None = None,
    measure: bool = True,
    tracer: Callable[[Pipeline], Report] | None = None,
    **options: Any,
) -> FixResult:
    """Diagnose, fix in memory, re-verify, and measure what the fix costs.

    `request` (or its fields as keywords, as for `diagnose`) says how to trace; where the
    trace runs is decided once, so every re-trace runs there too. The user's model is never
    changed: strategies that change weights work on a copy. `measure=False` skips parity
    and the autocast-vs-half comparison (extra forwards). `tracer` traces a pipeline whose model
    is not called as `model(**inputs)` (a diffusers pipeline's components: dtype_doctor.diffusion).
    """
    settings = FixSettings.of(settings, options)  # or its keywords: strategy=, fail_on=, unsafe_fixes=, force=, max_rounds=
    strategy, fail_on, unsafe_fixes, force, max_rounds = (settings.strategy, settings.fail_on, settings.unsafe_fixes,
                                                          settings.force, settings.max_rounds)
    request = settle(model, inputs, as_request(request, options))

    def trace(p: Pipeline) -> Report:
        return tracer(p) if tracer is not None else diagnose(p.model, p.inputs, p.request)

    start = Pipeline(model=model, inputs=dict(inputs.items()), request=request)
    before = trace(start)
    real = not before.target.simulated
    # One fp32 reference for every measurement; a model that cannot be copied is not measured.
    reference: torch.nn.Module | str | None = _guard(lambda: fp32_reference(model), str) if (real and measure) else None
    peaks = activation_peaks(reference, start.inputs) if isinstance(reference, torch.nn.Module) else None
    requested = None if strategy == "auto" else strategy
    # An unsafe strategy asked for by name is allowed, as --unsafe-fixes allows it.
    unsafe = unsafe_fixes or (requested is not None and STRATEGIES[requested].applicability == UNSAFE)
    ctx = Context(fail_on=fail_on, unsafe=unsafe, force=force, overflow=peaks, requested=requested)
    done = _fix_rounds(start, before, trace, ctx, max_rounds)
    report = done.report
    verified = not report.at_or_above(fail_on) and not (report.trace and report.trace.failure)
    measured = _measure(model, start, done.current, reference, peaks, verified=verified, real=real and measure)
    return FixResult(
        strategy=strategy, steps=done.steps, verified=verified, converged=verified or not done.progressing,
        rounds=done.rounds, detail=_detail(done, verified, fail_on, max_rounds), before=before, after=report,
        pipeline=done.current, parity=measured.parity, cost=measured.cost, tradeoff=measured.tradeoff,
    )


def _fix_rounds(start: Pipeline, before: Report, trace: Callable[[Pipeline], Report], ctx: Context,
                max_rounds: int) -> _Rounds:
    """Apply, re-trace, re-check, up to `max_rounds`: a strategy is kept where its re-trace scores
    better (no worse for one asked for by name in its first round), else rolled back."""
    fail_on, requested = ctx.fail_on, ctx.requested
    order = AUTO_ORDER if requested is None else (requested,)
    # A conversion asked for by name (keep-fp32) runs once even on a clean scan; it is kept
    # when the re-trace is no worse.
    on_request = requested is not None and STRATEGIES[requested].on_request
    current, report = start, before
    steps: list[Step] = []
    seen: set[tuple] = set()
    rounds = 0
    progressing = True
    while (report.at_or_above(fail_on) or (on_request and rounds == 0)) and rounds < max_rounds and progressing:
        rounds += 1
        progressing = False
        asked = on_request and rounds == 1
        for name in order:
            strat = STRATEGIES[name]
            if requested is None and not strat.relevant(report, ctx):
                continue
            candidate, step = strat.run(current, report, ctx)
            key = (name, step.changes)
            if key in seen:
                continue
            seen.add(key)
            if step.status != "applied":
                steps.append(step)
                continue
            after = trace(candidate)
            if _score(after, fail_on) < _score(report, fail_on) or (asked and _score(after, fail_on) <= _score(report, fail_on)):
                steps.append(step)
                current, report = candidate, after
                progressing = True
                break
            steps.append(
                Step(name, "failed", f"rolled back: {_score(report, fail_on)} → {_score(after, fail_on)} findings at or above {fail_on} after {step.detail}", step.changes)
            )
    return _Rounds(current, report, tuple(steps), rounds, progressing)


def _detail(done: _Rounds, verified: bool, fail_on: str, max_rounds: int) -> str:
    """One line on how the loop ended."""
    if verified:
        return "verified: the re-run trace has no finding at or above " + fail_on if done.steps else "nothing to fix"
    if done.rounds >= max_rounds and done.progressing:
        return f"failed to converge after {done.rounds} rounds"
    applied = any(s.status == "applied" for s in done.steps)
    if any(s.status == "failed" for s in done.steps) and not applied:
        return "no strategy made the re-run trace better (each was rolled back or does not apply)"
    if not applied:
        return "no strategy applies to the remaining findings"
    return "the applied fixes leave findings at or above " + fail_on


def _measure(model: torch.nn.Module, start: Pipeline, current: Pipeline, reference: torch.nn.Module | str | None,
             peaks: Mapping[str, float] | None, *, verified: bool, real: bool) -> _Measured:
    """What the fix costs against the fp32 reference (`reference` a str: why it could not be built)."""
    cost = Cost(weight_bytes(model), weight_bytes(current.model)) if real else None
    if isinstance(reference, torch.nn.Module):
        ref_model = reference
        parity: Parity | None = None
        # Parity of a pipeline that still fails means nothing; the trade-off is still measured.
        if verified:
            parity = _guard(lambda: output_parity(ref_model, start.inputs, current), lambda why: Parity(error=why))
        tradeoff = _guard(lambda: amp_vs_half(ref_model, current, peaks), lambda why: Tradeoff(error=why))
        return _Measured(parity, cost, tradeoff)
    if isinstance(reference, str):  # why the reference could not be built
        return _Measured(Parity(error=reference), cost, Tradeoff(error=reference))
    return _Measured(cost=cost)


def _guard(fn: Callable[[], T], failed: Callable[[str], Any]) -> Any:
    """fn(), or `failed(why)` where it raises: a measurement that cannot run is reported, not raised."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return failed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


# ---------------------------------------------------------------- measurement


def output_parity(reference: torch.nn.Module, inputs: Mapping[str, Any], fixed: Pipeline) -> Parity:
    """The fixed pipeline's output against the fp32 reference model on the original batch:
    floating data upcast to float32; every input the fix made integer (int32 labels → int64,
    float input_ids → int64) as the fix made it, since the reference itself needs those."""
    ref_inputs = {k: _reference_input(v, fixed.inputs.get(k, v)) for k, v in inputs.items()}
    name, ref = forward(reference, ref_inputs, None)
    _, got = forward(fixed.model, fixed.inputs, fixed.autocast)
    measured = output_diff(ref, got)
    return Parity("float32", name, measured.max_abs_diff, measured.cosine)


def _reference_input(original: Any, fixed: Any) -> Any:
    if isinstance(original, torch.Tensor) and original.is_floating_point():
        if isinstance(fixed, torch.Tensor) and not fixed.is_floating_point():
            return fixed  # an index or class label the fix made integer
        return original.float()
    return fixed


def activation_peaks(ref: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, float]:
    """Max |value| of each module's floating outputs in the fp32 reference: fp16 overflow evidence."""
    with module_peaks(ref) as peaks:
        try:
            forward(ref, fp32_inputs(inputs), None)
        except Exception as exc:  # noqa: BLE001 - no evidence is not an error
            if is_out_of_memory(exc):
                raise  # but no memory is: the overflow evidence the strategies rely on would be silently missing
            return {}
    return peaks


def amp_vs_half(ref_model: torch.nn.Module, fixed: Pipeline, peaks: Mapping[str, float] | None) -> Tradeoff:
    """The trade-off users ask about, measured on their model: autocast keeps fp32 weights
    and casts per op; half-model halves weight memory and risks overflow."""
    used = fixed.autocast or next(
        (dtype_name(p.dtype) for p in fixed.model.parameters() if p.dtype in (torch.float16, torch.bfloat16)), "float16"
    )
    dtype = getattr(torch, used)
    inputs32 = fp32_inputs(fixed.inputs)
    _, ref = forward(ref_model, inputs32, None)
    try:
        _, amp = forward(ref_model, inputs32, used)
        measured = output_diff(ref, amp)
        autocast = Alternative(weight_bytes(ref_model), measured.max_abs_diff, measured.cosine)
    except Exception as exc:  # noqa: BLE001
        autocast = Alternative(error=str(exc).splitlines()[0])
    half = copy.deepcopy(ref_model)
    convert_keeping_fp32(half, dtype)
    half_inputs = {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs32.items()}
    peak = None
    if peaks and used == "float16":
        worst = max(peaks.items(), key=lambda kv: kv[1])
        peak = Peak(worst[0], worst[1], FP16_MAX)
    try:
        _, out = forward(half, half_inputs, None)
        measured = output_diff(ref, out)
        half_model = Alternative(weight_bytes(half), measured.max_abs_diff, measured.cosine, max_activation=peak)
    except Exception as exc:  # noqa: BLE001
        half_model = Alternative(weight_bytes(half), error=str(exc).splitlines()[0], max_activation=peak)
    return Tradeoff(used, weight_bytes(ref_model), autocast, half_model)
