"""`run_script()`: launch the user's script under a RunSession and return what was traced."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from dtype_doctor.records.errors import InputError, UsageError, first_line, is_gpu_out_of_memory, is_out_of_memory, memory_words
from dtype_doctor.machine.placement import Placement, decide
from dtype_doctor.records import Report
from dtype_doctor.machine.user_code import user_frame
from dtype_doctor.records import LaunchConfig
from dtype_doctor.records.choices import CheckedOnce
from dtype_doctor.run.command import ScriptCommand, parse_command
from dtype_doctor.machine.control import DEFAULT_TIMEOUT, check_timeout, disarm, run_on_for, user_code
from dtype_doctor.run.launch import ScriptOutcome, launch

if TYPE_CHECKING:
    from dtype_doctor.run.session import RunSession


@dataclass(frozen=True)
class RunResult:
    command: ScriptCommand
    report: Report
    outcome: ScriptOutcome
    steps: int  # steps traced (fewer than asked when the script called the model fewer times)
    capture: object | None = None  # run.session.StepCapture: the model and the first step's inputs
    note: str | None = None  # why the trace ended where it did, when the script did not decide it
    kept: tuple[str, ...] = ()  # the files --keep-writes kept, where they are now


@dataclass(frozen=True)
class RunOptions(CheckedOnce):
    """How to run and trace the script: `dtype-doctor run`'s options, as a record."""

    steps: int = 1
    keep_running: bool = False
    select: Iterable[str] | str | None = None
    ignore: Iterable[str] | str | None = None
    simulate: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N: the machine the script sees
    gpu: str | None = None  # the GPU a simulated script sees (t4, a100, 8.0)
    gpus: int = 1  # simulated GPUs the script sees (--gpus)
    macos: str | None = None  # the macOS a simulated mps script sees (--macos)
    launch: LaunchConfig | None = None  # a launcher line (accelerate launch, torchrun): rank 0 of its world
    timeout: float | None = DEFAULT_TIMEOUT  # seconds the script may run until its traced steps are done
    keep_writes: str | None = None  # where a simulated run keeps the files the script wrote (else they are dropped)
    horizon: float | None = None  # with keep_running: seconds the script may go on past its traced steps (None: to its end)

    def validate(self) -> None:
        from dtype_doctor.machine.placement import parse_device
        from dtype_doctor.rules import parse_codes

        if self.steps < 1:
            raise UsageError(f"--steps must be at least 1, not {self.steps}")
        check_timeout(self.timeout)
        parse_codes(self.select)
        parse_codes(self.ignore)
        parse_device(self.device)
        if self.macos is not None or str(self.device).startswith("mps"):
            self.placement  # noqa: B018 - --device mps/--macos: refused here, before the script starts
        if self.horizon is not None and not self.horizon > 0:
            raise UsageError(f"--horizon must be a number of seconds above 0, not {self.horizon}")
        if self.simulate and self.device == "cpu":
            raise UsageError("--simulate makes the script see a CUDA machine; --device cpu contradicts it (use --device cuda, or leave --simulate out)")
        if self.keep_writes is not None:
            import os

            if not self.simulate:
                raise UsageError("--keep-writes keeps what a --simulate run held back; a real run writes as the script does")
            if os.path.exists(self.keep_writes) and not os.path.isdir(self.keep_writes):
                raise UsageError(f"--keep-writes {self.keep_writes}: not a directory")
        if self.gpu is not None:
            from dtype_doctor.machine.gpus import check_gpu

            check_gpu(self.gpu)
            if not self.simulate:
                raise UsageError("--gpu sets the GPU a --simulate run targets; add --simulate (a real run uses the GPU it has)")

    @cached_property
    def placement(self) -> Placement:
        """Where the script's CUDA runs, decided here, once: simulated, hidden (--device cpu) or real.
        No GPU here and no --simulate: refused, naming --simulate."""
        return decide(self.device, simulate=self.simulate, gpu=self.gpu, gpus=self.gpus, macos=self.macos)

    def session_options(self) -> dict[str, object]:
        """The RunSession keywords: the Placement, and whether a real GPU is hidden from the script."""
        import torch

        where = self.placement
        hide = not where.simulated and self.device == "cpu" and torch.cuda.is_available()
        return {"placement": where, "hide_cuda": hide, "launch": self.launch,
                "keep_writes": self.keep_writes if where.simulated else None}


def run_script(
    command: ScriptCommand | list[str] | tuple[str, ...],
    *,
    steps: int = 1,
    keep_running: bool = False,
    select: Iterable[str] | str | None = None,
    ignore: Iterable[str] | str | None = None,
    on_report: Callable[[Report], None] | None = None,
    options: RunOptions | None = None,
    sources: Mapping[str, str] | None = None,
) -> RunResult:
    """Run `python FILE ARGS` / `python -m MODULE ARGS` in this process and trace its first step(s).

    `options` (a RunOptions) replaces steps / keep_running / select / ignore and adds the
    simulation; `sources` (path → text) runs patched text in place of those files.
    `on_report` is called with the report as soon as the traced steps are done, before the
    script goes on (keep_running) or is stopped.
    """
    from dtype_doctor.run.session import RunSession

    options = options or RunOptions(steps=steps, keep_running=keep_running, select=select, ignore=ignore)
    options.validated()
    if not isinstance(command, ScriptCommand):
        command = parse_command(list(command))

    def reported(report: Report) -> None:
        disarm()  # the time limit covers the traced steps; --keep-running goes on without one
        if options.keep_running and options.horizon:
            run_on_for(options.horizon)  # or as far as it was asked to
        if on_report is not None:
            on_report(report)

    session = RunSession(steps=options.steps, keep_running=options.keep_running, select=options.select,
                         ignore=options.ignore, on_report=reported, label=command.display, **options.session_options())
    with user_code(command.display, options.timeout), session:
        outcome = launch(command, sources)
        oom = outcome.error is not None and is_out_of_memory(outcome.error) and session.report is None
        if oom:
            session.on_report = None  # the machine's limit, not the model's: no report, the batch named instead
        session.close(outcome.ended_by)
    if oom:
        raise out_of_memory(command.display, outcome.error, simulated=options.placement.simulated, stepped=session.forwards > 0)  # type: ignore[arg-type]
    if session.report is None:
        return _without_a_model_report(command, outcome, session, options, reported)
    return RunResult(command, session.report, outcome, min(session.steps, options.steps), session.capture, session.note,
                     tuple(session.kept))


def _without_a_model_report(command: ScriptCommand, outcome: ScriptOutcome, session: RunSession, options: RunOptions,
                            reported: Callable[[Report], None]) -> RunResult:
    """A script that called no model: a report of its launch configuration (it stopped at
    TrainingArguments) or of its refused quantized load (DD505), else an InputError saying why."""
    refused = session.trainer_args.refused
    if refused is not None and outcome.error is not None and outcome.error is session.trainer_args.refused_error:
        # The script stopped at TrainingArguments(...): a report of its launch configuration alone.
        from dtype_doctor.run.trainer_args import refused_report

        report = refused_report(session.trainer_args.launch, command.display, f"TrainingArguments(...){user_frame(outcome.error)}",  # type: ignore[arg-type]
                                options.select, options.ignore, options.placement.simulated)
        reported(report)
        return RunResult(command, report, outcome, 0)
    # No model call means no report.
    error = outcome.error
    if error is not None:
        refused_model = refused_load(error, command, options)
        if refused_model is not None:  # transformers refused the script's quantized model for its device map (DD505)
            reported(refused_model)
            return RunResult(command, refused_model, outcome, 0)
        from dtype_doctor.run.precision import refused_read_report

        refused_read = refused_read_report(error, session, command, options)
        if refused_read is not None:  # a TF32 read PyTorch refused: the two APIs mixed (DD114)
            reported(refused_read)
            return RunResult(command, refused_read, outcome, 0)
        from dtype_doctor.run.before_model import raised_report

        raised = raised_report(session.book, error, command, options)
        if raised is not None:  # a torch call of the script's own refused dtypes or devices before any model call
            reported(raised)
            return RunResult(command, raised, outcome, 0)
        where = user_frame(error)
        from dtype_doctor.machine.fake_packages import not_simulated

        why = not_simulated(error) if options.placement.simulated else ""  # a CUDA-only package the simulation has no fake of
        raise InputError(
            f"{command.display} raised {type(error).__name__} before calling a model{where}: {first_line(error)}{why}"
        ) from error
    raise _no_model_call(command, outcome)


def _no_model_call(command: ScriptCommand, outcome: ScriptOutcome) -> InputError:
    """Why a script that raised nothing called no model: where a simulation stopped it, or its end."""
    stop = outcome.stop
    if stop is not None and getattr(stop, "limit", None):
        return InputError(f"{command.display} calls {stop.limit} at {stop.where} before calling a model: "  # type: ignore[attr-defined]
                          f"{stop.limit_said}")  # type: ignore[attr-defined]
    if stop is not None and getattr(stop, "where", None):
        return InputError(
            f"{command.display} asks a simulated CUDA tensor for its value at {stop.where} ({stop.what}) "  # type: ignore[attr-defined]
            "before calling a model; --simulate cannot follow it past there"
        )
    return InputError(
        f"{command.display} ended (exit code {outcome.exit_code}) without calling a model "
        "(a torch.nn.Module with parameters)"
    )


def refused_load(error: BaseException, command: ScriptCommand, options: RunOptions) -> Report | None:
    """The report of a load transformers refused before any step (a bitsandbytes model whose device
    map offloads without llm_int8_enable_fp32_cpu_offload), or None for any other error."""
    import dataclasses

    from dtype_doctor.diagnosis import environment, judged
    from dtype_doctor.load.offload import refusal_of, refused_trace
    from dtype_doctor.records import SourceLoc, Target
    refusal = refusal_of(error)
    if refusal is None:
        return None
    gpu = options.placement.profile if options.placement.simulated else None
    trace = refused_trace(refusal, device=options.placement.device or "cpu", simulated=options.placement.simulated, gpu=gpu)
    where = user_frame(error).removeprefix(" at ")
    source = SourceLoc(where.rpartition(":")[0], int(where.rpartition(":")[2])) if where else None
    findings = tuple(dataclasses.replace(f, source=f.source or source) for f in judged(trace, select=options.select, ignore=options.ignore))
    target = Target(command.display, None, None, trace.device, trace.simulated, None, None, False, gpu=trace.gpu,
                    quantization=refusal.quantization)
    environment_ = environment()
    return Report(findings=findings, target=target, environment=environment_, trace=trace)


def out_of_memory(display: str, error: BaseException, *, simulated: bool = False, stepped: bool = True) -> InputError:
    """The script ran out of memory: bad input naming where (exit 2), as `scan` names its --batch-size
    (pipeline.memory_named), not a finding about the model. Before any model call (`stepped` False)
    the batch size is not what to lower. --simulate is named only for a GPU's out-of-memory
    (torch.OutOfMemoryError) in a real run: it fakes the script's GPU tensors, while what runs on
    the CPU stays real under it (a CPU step that ran out of memory runs out under --simulate too)."""
    where = user_frame(error)
    if not stepped:
        return InputError(f"{display} ran out of memory before calling a model{where} ({memory_words(error)})")
    gpu = is_gpu_out_of_memory(error) and not simulated
    hint = "lower the batch size of its step" + (", or pass --simulate to trace without allocating" if gpu else "")
    return InputError(f"{display} ran out of memory{where} ({memory_words(error)}); {hint}")
