"""DD002: a simulated run whose step never touched the simulated GPU.

`run --simulate` gives the script a CUDA machine; whether the script uses it is the script's
choice (a `--device` argument left at `cpu`, a device picked by a test the simulation does not
answer, a script with no GPU path at all). A step that ran on the CPU says nothing of the GPU
that was asked for: reporting it clean would be a clean bill for a machine other than the one
asked for, the answer a user must never get.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def _on_gpu(device: str) -> bool:
    return device.startswith("cuda")


def used_the_gpu(trace: Trace) -> bool:
    """Whether the model, an input or any op's tensor of the step was on a (simulated) CUDA device."""
    if _on_gpu(trace.device) or any(_on_gpu(t.device) for t in trace.inputs):
        return True
    return any(_on_gpu(t.device) for op in trace.ops for t in (*op.operands, *op.outputs))


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.simulated or trace.gpu is None or trace.world is not None:
        return  # a GPU was asked for only where the simulation has a GPU profile (not `--simulate --device cpu`)
    if used_the_gpu(trace) or not (trace.ops or trace.modules):
        return
    gpu = trace.gpu or "CUDA GPU"
    yield RULE.finding(
        f"--simulate gave the script a {gpu}, and its step ran on {trace.device}: the model and its tensors never "
        "reached the simulated GPU, so nothing about that GPU was checked",
        module="",
        module_type=trace.model.class_name,
        stage="transfer",
        hints=("tell the script to use the GPU as you would on the GPU machine (its own --device cuda argument, "
               "its config or environment variable), then run it under --simulate again",),
    )


RULE = Rule(
    code="DD002",
    name="simulated-gpu-unused",
    severity="error",
    summary="A run under --simulate whose step never put the model or a tensor on the simulated GPU: the GPU asked for was not checked.",
    why=(
        "A script decides its own device. Left on the CPU (a --device argument defaulting to cpu, a check the "
        "script makes before it trusts a GPU, no GPU path at all), its step checks the CPU's kernels and dtypes, "
        "not the GPU's: bf16 on a T4, fp16 autocast and its GradScaler, CUDA's device mismatches are never reached. "
        "A clean report would then speak for a machine that was not checked."
    ),
    example="device = 'cuda' if args.cuda else 'cpu'   # args.cuda defaults to False\n"
            "dtype-doctor run --simulate --gpu t4 -- python train.py\n"
            "DD002 --simulate gave the script a t4 (compute capability 7.5), and its step ran on cpu",
    fix="Run the script as you would on the GPU machine: pass it the argument, config or environment variable "
        "that makes it use CUDA.",
    fix_safety="display-only: how the script picks its device is the script's own choice.",
    check=check,
    device_note="Only under --simulate: a real run reports the device the script used.",
)
