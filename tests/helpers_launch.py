"""A traced step with a launch configuration attached, for the launch rules' own tests."""

from __future__ import annotations

import dataclasses

import torch

import dtype_doctor
from dtype_doctor.records import LaunchConfig
from dtype_doctor.rules import run_rules
from dtype_doctor.run.launchers import with_deepspeed


def judged(launch: LaunchConfig, ds: dict | None = None, gpu: str | None = None) -> set[str]:
    """The codes the rules give a tiny simulated step launched with `launch` (and DeepSpeed JSON `ds`)."""
    if ds is not None:
        launch = with_deepspeed(launch, ds)
    report = dtype_doctor.diagnose(torch.nn.Linear(4, 2), {"input": torch.randn(2, 4)}, simulate=True, device="cuda", gpu=gpu)
    trace = dataclasses.replace(report.trace, launch=launch)
    return {f.code for f in run_rules(trace)}
