"""A transformers `TrainerCallback` that diagnoses the first training step.

    from dtype_doctor.integrations.transformers import DtypeDoctorCallback
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[DtypeDoctorCallback()])
    trainer.train()   # raises DtypeDoctorStop before the first step when it would fail

The first time the model is called in training, the batch Trainer built (after the collator,
on the model's device, under Trainer's own autocast) is traced with `diagnose(train=True)`
before the real step runs; the model is left as it was. Findings at or above `fail_on` stop
the run with every mismatch named (PyTorch would name only the first); `stop=False` only
reports them. The report is kept on `callback.report`.
"""

from __future__ import annotations

import sys
from typing import Any

from transformers import TrainerCallback

from dtype_doctor.records import Report


class DtypeDoctorStop(RuntimeError):
    """The first training step has findings at or above fail_on; `.report` has them all."""

    def __init__(self, report: Report, fail_on: str) -> None:
        shown = report.at_or_above(fail_on)
        lines = [f"dtype-doctor found {len(shown)} problem{'s' if len(shown) != 1 else ''} in the first training step:"]
        lines += [f"  {f.code} {f.severity} at {f.module or '<model>'}: {f.message}" for f in shown]
        super().__init__("\n".join(lines))
        self.report = report


class DtypeDoctorCallback(TrainerCallback):
    def __init__(self, *, fail_on: str = "error", stop: bool = True, select: Any = None, ignore: Any = None) -> None:
        from dtype_doctor.report.common import FAIL_ON

        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
        self.fail_on, self.stop = fail_on, stop
        self.select, self.ignore = select, ignore
        self.report: Report | None = None
        self._handle: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None and self.report is None:
            self._handle = model.register_forward_pre_hook(self._first_step, with_kwargs=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _first_step(self, model: Any, args: tuple, kwargs: dict) -> None:
        if not model.training:
            return  # an evaluation before training: not the step this callback is for
        self._remove()
        import inspect

        from dtype_doctor.diagnosis import diagnose

        inputs = dict(kwargs)
        if args:
            inputs.update(inspect.signature(model.forward).bind_partial(*args).arguments)
        self.report = diagnose(model, inputs, train=True, autocast=_autocast_in_force(), select=self.select, ignore=self.ignore)
        shown = self.report.at_or_above(self.fail_on)
        if not shown:
            return
        if self.stop:
            raise DtypeDoctorStop(self.report, self.fail_on)
        for f in shown:
            print(f"dtype-doctor: {f.code} {f.severity} at {f.module or '<model>'}: {f.message}", file=sys.stderr)


def _autocast_in_force() -> str | None:
    import torch

    from dtype_doctor.numerics import dtype_name

    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return dtype_name(torch.get_autocast_dtype(device_type))
    return None
