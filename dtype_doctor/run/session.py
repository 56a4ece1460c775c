"""Arm the recorder around the user's script and trace its first step(s).

While the script runs, `torch.nn.Module.__call__` is wrapped: the first top-level call of a
module that has parameters is the model, and starts the recorder (module hooks plus the
dispatch mode, repair-and-continue, so every mismatch of the step is seen). Everything up
to the model's next top-level call — loss, backward, GradScaler, optimizer — belongs to
the step. When step N+1 would start, the trace ends, the report is handed on, and the
script is stopped (or, with keep_running, left to go on unwatched).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterable

import torch

from dtype_doctor.records import Report, Subject, TraceFailure, TraceRequest
from dtype_doctor.run.launch import StopScript
from dtype_doctor.run.lineage import LineageBook, LineageMode, boundary_lineage, patch_datasets, sources_of
from dtype_doctor.trace.engine import _failure, live_trace, model_info, report_from_trace
from dtype_doctor.trace.recorder import Recorder


class RunSession:
    """`with RunSession(...) as s: launch(command)`; `s.report` is the traced step(s), or None."""

    def __init__(
        self,
        *,
        steps: int = 1,
        keep_running: bool = False,
        select: Iterable[str] | str | None = None,
        ignore: Iterable[str] | str | None = None,
        on_report: Callable[[Report], None] | None = None,
        label: str | None = None,
    ) -> None:
        self.label = label  # what the report names as the target: the script
        self.max_steps = steps
        self.keep_running = keep_running
        self.select, self.ignore = select, ignore
        self.on_report = on_report
        self.report: Report | None = None
        self.model: torch.nn.Module | None = None
        self.steps = 0
        self._rec: Recorder | None = None
        self._modes: contextlib.ExitStack | None = None
        self._failure: TraceFailure | None = None
        self._depth = 0
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self._original_call: Any = None
        self._original_next: Any = None
        self._lineage_mode: LineageMode | None = None
        self._unpatch_datasets: Callable[[], None] = lambda: None
        # Lineage is the pipeline's: inside the model the recorder sees everything.
        self.book = LineageBook(is_paused=lambda: self._depth > 0)
        self._lineage: dict[str, tuple] = {}

    # ------------------------------------------------------------------ arming

    def __enter__(self) -> "RunSession":
        original = torch.nn.Module.__call__
        session = self

        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return session._call(original, module, args, kwargs)

        self._original_call = original
        torch.nn.Module.__call__ = __call__  # type: ignore[method-assign]
        self._patch_loader()
        self._lineage_mode = LineageMode(self.book)
        self._lineage_mode.__enter__()
        self._unpatch_datasets = patch_datasets(self.book)
        return self

    def _patch_loader(self) -> None:
        """Fetching the next batch is not part of the step: its ops (formatters, collate) are not recorded."""
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        original = _BaseDataLoaderIter.__next__
        session = self

        def __next__(it: Any) -> Any:
            rec = session._rec if session.report is None else None
            if rec is None:
                return original(it)
            rec._suspended += 1
            try:
                return original(it)
            finally:
                rec._suspended -= 1

        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]
        self._original_next = original

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._disarm()
        if self._rec is not None and self.report is None:
            self.finish(exc)
        return False

    def _disarm(self) -> None:
        if self._lineage_mode is not None:
            self._lineage_mode.__exit__(None, None, None)
            self._lineage_mode = None
            self._unpatch_datasets()
        if self._original_next is not None:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            _BaseDataLoaderIter.__next__ = self._original_next  # type: ignore[method-assign]
            self._original_next = None
        if self._original_call is not None:
            torch.nn.Module.__call__ = self._original_call  # type: ignore[method-assign]
            self._original_call = None

    # ------------------------------------------------------------------- calls

    def _call(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        top_level = self._depth == 0 and threading.get_ident() == self._thread and os.getpid() == self._pid
        if top_level and self.report is None:
            if self.model is None and _has_parameters(module):
                self._start(module, args, kwargs)
            elif module is self.model:
                self.steps += 1
                if self.steps <= self.max_steps:
                    self._lineage = boundary_lineage(self.book, module, args, kwargs)
                if self.steps > self.max_steps:
                    self.finish(None)
                    if not self.keep_running:
                        raise StopScript()
            elif self.model is not None and _has_parameters(module):
                return self._unrecorded(original, module, args, kwargs)
        self._depth += 1
        try:
            return original(module, *args, **kwargs)
        except Exception as exc:
            if top_level and module is self.model and self._rec is not None and self.report is None:
                self._failure = _failure(self._rec, exc)
            raise
        finally:
            self._depth -= 1

    def _unrecorded(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """A second model called in the step (a teacher, a frozen encoder): its ops are not this model's."""
        assert self._rec is not None
        self._rec._suspended += 1
        self._depth += 1
        try:
            return original(module, *args, **kwargs)
        finally:
            self._depth -= 1
            self._rec._suspended -= 1

    def _start(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.model = model
        self.steps = 1
        self._info = model_info(model)
        self._rec = Recorder(model, recover=True)
        self._lineage = boundary_lineage(self.book, model, args, kwargs)
        self._rec.attach()  # before the call: the root's own pre-hook tags the forward's inputs
        self._modes = contextlib.ExitStack()
        self._modes.enter_context(self._rec.function_mode())
        self._modes.enter_context(self._rec.dispatch_mode())

    # ------------------------------------------------------------------ report

    def finish(self, error: BaseException | None) -> Report:
        """End the trace: `error` is what ended the script during the traced step(s), if anything."""
        assert self._rec is not None and self.model is not None and self._modes is not None
        self._modes.close()
        self._rec.detach()
        if self.keep_running:
            self._disarm()  # the rest of the run goes at full speed
        failure = self._failure
        report = self._report(failure)
        if failure is None and error is not None and not isinstance(error, (StopScript, SystemExit)):
            # Raised outside the model's forward (the loss, GradScaler, the optimizer). When no
            # error-level finding explains it, the step is not clean: the trace stopped early.
            if not report.at_or_above("error"):
                from dtype_doctor.errors import first_line

                failure = TraceFailure("other", f"{type(error).__name__}: {first_line(error)}", "", type(self.model).__name__, None, "training step")
                report = self._report(failure)
        self.report = report
        if self.on_report is not None:
            self.on_report(report)
        return report

    def _report(self, failure: TraceFailure | None) -> Report:
        assert self._rec is not None and self.model is not None
        trace = live_trace(self._rec, self._info, failure, lineage=self._lineage, sources=sources_of(self._lineage))
        request = TraceRequest(select=self.select, ignore=self.ignore, subject=Subject(model=self.label))
        return report_from_trace(trace, self.model, request)


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None
