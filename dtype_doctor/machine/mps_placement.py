"""Apple silicon as a target: `--device mps` (with `--simulate`, `--macos VERSION`) decided into a Placement.

A simulated mps tensor lives where a simulated GPU's does (meta, machine/home.py) and the report
names it mps:0; the verdicts are the installed torch's MPS expectations (machine/mps_expectations.py).
A real `mps` device is used as a real CUDA one is, where torch has it.
"""

from __future__ import annotations

from typing import Any

from dtype_doctor.records.errors import UsageError

MPS0 = "mps:0"


def decide_mps(wanted: str | None, *, simulate: bool, gpu: str | None, gpus: int, device_map: Any,
               macos: str | None) -> tuple[str, bool, tuple[int, int] | None]:
    """(device, simulated, macOS) of an mps target, for machine.placement.decide's Placement; refuses what
    a Mac cannot be given (a GPU profile, several GPUs, a device map, a macOS torch's MPS does not
    support, a real mps where torch has none)."""
    from dtype_doctor.machine.mps_expectations import macos_version

    if wanted is not None and not wanted.startswith("mps"):
        raise UsageError(f"--macos sets the macOS of an Apple-silicon target; use --device mps, not {wanted}")
    if gpu is not None or gpus != 1 or device_map is not None:
        raise UsageError("--gpu, --gpus and --device-map describe CUDA GPUs; --device mps is one Apple-silicon device")
    try:
        version = macos_version(macos)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if simulate:
        return MPS0, True, version
    if macos is not None:
        raise UsageError("--macos sets the macOS a --simulate trace targets; add --simulate (a real Mac runs its own)")
    import torch

    if not torch.backends.mps.is_available():
        raise UsageError("device mps is not available here (torch.backends.mps.is_available() is False); "
                         "pass --simulate to trace for it with fake tensors")
    return MPS0, False, None


def enter_simulation(stack: Any, placement: Any, target: Any, **options: Any) -> Any:
    """The simulated machine of a run, entered on `stack`: CudaSimulation for a CUDA target; for an mps
    one CudaSimulation on cuda:0 behind MpsFace (machine/mps_simulation.py), so the script sees a Mac."""
    import torch

    from dtype_doctor.machine.simulate import CudaSimulation

    label = torch.device("cuda", 0) if placement.apple else target
    simulation = stack.enter_context(CudaSimulation(label, placement.profile, gpus=placement.gpus, **options))
    if placement.apple:
        from dtype_doctor.machine.mps_simulation import MpsFace

        stack.enter_context(MpsFace(simulation, placement.macos))
    return simulation


def stopped_on_a_mac() -> str:
    """What a simulated Mac run says where it stops the script (its model's next call after the traced step):
    the code after that line did not run, so a float64 copy to mps there (sampling after an epoch, an
    evaluation loop's batch) is not seen. The script goes no further because past the step its tensors hold
    no data: its own loop would run every batch on stand-in values (docs/mps.md, Limits)."""
    from dtype_doctor.machine.user_code import user_site

    at = user_site(2)
    where = f" at {at.file}:{at.line}" if at is not None else ""
    return (f"the simulated Mac stopped the script{where}, its model's next call after the traced step: code after it "
            "(an evaluation loop, sampling) did not run, and a float64 copy to mps there is not checked")
