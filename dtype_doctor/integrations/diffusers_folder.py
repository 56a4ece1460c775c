"""`scan PIPELINE_DIR` and `fix PIPELINE_DIR`: a diffusers pipeline folder (model_index.json), loaded
as a user's script would and traced as one denoising step (dtype_doctor.diffusion).

    report = scan_pipeline("sd-tiny", None, ScanOptions(), prompt="a photo")
    report = fix_pipeline("sd-tiny", None, ScanOptions(), prompt="a photo", write_patch="fix.patch")

`--simulate` traces the same step on a simulated CUDA machine, as `run --simulate` runs a script's
(machine/simulate.py through run's RunSession): the pipeline is loaded with its real weights on the
CPU, moved to the simulated GPU (tensors without data), and called once; a finding needing values
(DD802's overflow) is not measured there.

A fix changes the loaded pipeline in memory (cast-component, vae-fp32), re-traces the step to
verify it, and writes the change as lines of the user's loading code: into `--script FILE.py`
(before its pipeline's first call) or, without one, a new `dtype_doctor_fix.py` whose
`apply_fix(pipe)` the user calls after loading. The files in the folder are never changed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from dtype_doctor.records.errors import UsageError
from dtype_doctor.records import Report, Subject
from dtype_doctor.trace.request import TraceRequest

DEFAULT_PROMPT = "a photo"
FIX_MODULE = "dtype_doctor_fix.py"
# A dataset of prompts: the first row's text, from the first of these columns it has (else its first text).
PROMPT_COLUMNS = ("prompt", "text", "caption")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The loaded pipeline, the prompt it is called with, and how to trace it."""

    loaded: Any  # load.pipeline_dir.LoadedPipeline
    prompt: str
    request: TraceRequest

    def trace(self, pipeline: Any, request: TraceRequest | None = None, prompt: str | None = None) -> Report:
        from dtype_doctor.diffusion import diagnose_pipeline

        return self.finished(diagnose_pipeline(pipeline, request or self.request, prompt=prompt or self.prompt))

    def finished(self, report: Report) -> Report:
        """The report with the load's facts: the dtype the pipeline loaded in, and where it came from."""
        facts = dataclasses.replace(self.loaded.load_facts, dtype=report.target.model_dtype or self.loaded.load_facts.dtype)
        return dataclasses.replace(report, target=dataclasses.replace(report.target, loaded_dtype=facts))


def load(spec: str, dataset: str | None, options: Any, prompt: str | None,
         progress: Callable[[str], None] | None = None, *, fixing: bool = False) -> Loaded:
    from dtype_doctor.load.pipeline_dir import load_pipeline, refuse_options

    options.validated()
    refuse_options(options, fixing=fixing)
    if dataset is not None and prompt is not None:
        raise UsageError("--prompt and DATASET both give the prompt; pass one")
    say = progress or (lambda _msg: None)
    if dataset is not None:
        say(f"reading a prompt from {dataset}")
        prompt = prompt_from(dataset, options.split)
    say(f"loading pipeline {spec}")
    device = "cpu" if options.placement.simulated else options.placement.device or "cpu"  # simulated: moved where traced
    loaded = load_pipeline(spec, dtype=options.dtype, device=device,
                           trust_remote_code=options.trust_remote_code, allow_pickle=options.allow_pickle,
                           components=options.component_dtypes)
    request = TraceRequest(placement=dataclasses.replace(options.placement, device=None), select=options.select,
                           ignore=options.ignore, subject=Subject(spec, dataset, options.split if dataset else None))
    say("tracing one denoising step" + (" on a simulated GPU" if options.placement.simulated else ""))
    return Loaded(loaded, prompt or DEFAULT_PROMPT, request)


def prompt_from(dataset: str, split: str | None) -> str:
    """The first row's prompt: its prompt/text/caption column, else its first text."""
    from dtype_doctor.records.errors import InputError
    from dtype_doctor.load import load_rows

    row = load_rows(dataset, split=split, n=1).dataset[0]
    texts = {k: v for k, v in row.items() if isinstance(v, str) and v.strip()}
    column = next((c for c in PROMPT_COLUMNS if c in texts), next(iter(texts), None))
    if column is None:
        raise InputError(f"{dataset} has no text column to read a prompt from; pass --prompt instead")
    return texts[column]


def scan_pipeline(spec: str, dataset: str | None, options: Any, *, prompt: str | None = None,
                  progress: Callable[[str], None] | None = None) -> Report:
    """Load the pipeline folder, trace one denoising step, judge it."""
    it = load(spec, dataset, options, prompt, progress)
    if options.placement.simulated:
        return it.finished(simulated_step(it, spec, options.placement))
    return it.trace(it.loaded.pipeline)


def simulated_step(it: Loaded, spec: str, placement: Any) -> Report:
    """The pipeline's one call on a simulated CUDA machine, traced as `run --simulate` traces a
    script's: moved to the GPU and called inside a RunSession, each component traced as itself."""
    from dtype_doctor.diffusion import call_arguments
    from dtype_doctor.records.errors import InputError, StopScript, first_line
    from dtype_doctor.run.session import RunSession

    pipe = it.loaded.pipeline
    kwargs = call_arguments(pipe)
    session = RunSession(steps=1, select=it.request.select, ignore=it.request.ignore, label=spec, placement=placement)
    session.models.expect(pipe)
    error: BaseException | None = None
    with session:
        try:
            pipe.to(placement.device)
            pipe(it.prompt, **kwargs)
        except StopScript:
            pass
        except Exception as exc:  # noqa: BLE001 - the report holds the failure, as run's does
            error = exc
        session.close(error)
    if session.report is None:
        said = f": {type(error).__name__}: {first_line(error)}" if error is not None else ""
        raise InputError(f"{spec}: the simulated pipeline call stopped before its first component ran{said}")
    return _libraries_named(session.report)


def _libraries_named(report: Report) -> Report:
    """No line of the user's asked for the stand-ins (the doctor called the pipeline): a library's
    line is named from its package ("diffusers/schedulers/scheduling_ddim.py:448"), not site-packages."""
    trace = report.trace
    if trace is None or not trace.stand_ins:
        return report

    def named(loc: Any) -> Any:
        parts = Path(loc.file).parts if loc else ()
        at = max((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), default=None)
        return dataclasses.replace(loc, file="/".join(parts[at + 1:])) if at is not None else loc

    stand_ins = tuple(dataclasses.replace(s, source=named(s.source)) for s in trace.stand_ins)
    return dataclasses.replace(report, trace=dataclasses.replace(trace, stand_ins=stand_ins))


def fix_pipeline(spec: str, dataset: str | None, options: Any, *, prompt: str | None = None,
                 settings: "FixSettings | None" = None, write_patch: str | None = None,  # noqa: F821 - imported lazily
                 script: str | None = None, progress: Callable[[str], None] | None = None, **fixing: Any) -> Report:
    """Fix the pipeline's components in memory, re-trace to verify, and write the fix as a patch.
    `settings` (a fix.settings.FixSettings), or its fields as keywords (strategy=, fail_on=, ...)."""
    from dtype_doctor.diffusion import PipelineComponents
    from dtype_doctor.fix.engine import fix_model
    from dtype_doctor.fix.settings import FixSettings
    from dtype_doctor.pipeline import fix_files

    settings = FixSettings.of(settings, fixing)
    if fixing:
        raise TypeError(f"fix_pipeline() got unexpected keyword argument(s): {', '.join(fixing)}")
    fail_on, force = settings.fail_on, settings.force
    patch_path, script_path = fix_files(write_patch, script, force=force)
    it = load(spec, dataset, options, prompt, progress, fixing=True)
    result = fix_model(PipelineComponents(it.loaded.pipeline), {"prompt": it.prompt}, it.request, settings=settings, measure=False,
                       tracer=lambda p: it.trace(p.model.pipeline, p.request, p.inputs["prompt"]))
    if patch_path is None:
        return result.report(None)
    if not result.verified:
        return result.report(None, patch_skipped="the fix was not verified, so it is not written")
    if not result.applied:
        return result.report(None)  # nothing to fix, so nothing to patch: no file written
    from dtype_doctor.fix.pipeline_patch import write_pipeline_patch

    def check(apply_fix: Callable[[Any], Any]) -> str | None:
        """The written lines, run on the pipeline loaded afresh: None when its step is clean at --fail-on."""
        again = load(spec, dataset, options, it.prompt, fixing=True)
        after = it.trace(apply_fix(again.loaded.pipeline))
        left = after.at_or_above(fail_on)
        return f"{len(left)} finding(s) at or above {fail_on} remain ({', '.join(sorted({f.code for f in left}))})" if left else None

    return result.report(write_pipeline_patch(result.applied, spec, patch_path, script_path, force=force, check=check))
