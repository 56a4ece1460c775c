"""The machine a run's script sees (run/session.py's RunSession arms it): on `--simulate`, a CUDA
machine — its disk overlay (machine/disk.py), its CUDA (machine/simulate.py), its child processes
(machine/workers.py) and its CUDA-only packages (machine/fake_packages.py); on `--device cpu` with
a real GPU, a machine whose GPU is hidden. Moved out of RunSession as it was, so the session holds
the script's execution and this module the surface it runs on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from dtype_doctor.machine.placement import CUDA0, Placement
from dtype_doctor.machine.user_code import user_site


class ScriptSurface:
    """The simulated machine (or the hidden GPU) around one run: armed on the session's ExitStack."""

    def __init__(self, placement: Placement, *, hide_cuda: bool = False, keep_writes: str | None = None) -> None:
        self.placement = placement
        # simulated GPUs: with several, cuda:k lives on meta:k
        self.target = torch.device(placement.device or CUDA0) if placement.simulated else None
        self.hide_cuda = hide_cuda
        self.simulation: Any = None  # machine.simulate.CudaSimulation, while simulated
        # A simulated script writes into scratch (machine/disk.py); `keep_writes` is where to keep what it wrote.
        self.disk: Any = None
        self.keep_writes = keep_writes
        self.kept: list[str] = []

    def arm_disk(self, arms: contextlib.ExitStack) -> None:
        """A simulated script's writes go to scratch, from before anything else is armed."""
        if self.placement.simulated:
            from dtype_doctor.machine.disk import Overlay

            self.disk = Overlay(site=user_site)
            arms.callback(self.put_away_writes)
            arms.enter_context(self.disk)

    def arm_machine(self, arms: contextlib.ExitStack, on_amp: Callable[[Any], None], in_forward: Callable[[], bool]) -> None:
        """The simulated CUDA machine, its workers and packages; or, with hide_cuda, no GPU at all."""
        if self.placement.simulated:
            from dtype_doctor.machine.mps_placement import enter_simulation

            assert self.target is not None
            # CUDA's simulation; for --device mps behind a Mac's face (machine/mps_simulation.py)
            self.simulation = enter_simulation(arms, self.placement, self.target, on_amp=on_amp, in_forward=in_forward)
            from dtype_doctor.machine.workers import Children

            # DataLoader workers and other child processes see the simulated machine (machine/workers.py).
            arms.enter_context(Children(self.disk, str(self.simulation.label), self.placement.gpu, self.placement.gpus,
                                        self.placement.macos))
            from dtype_doctor.machine.fake_packages import CudaOnlyPackages

            arms.enter_context(CudaOnlyPackages(self.simulation.refusal))  # flash-attn, xformers (machine/fake_packages.py)
        elif self.hide_cuda:
            arms.enter_context(hidden_cuda())

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype the simulated machine runs under, or None (or not simulated)."""
        return self.simulation.amp_dtype if self.simulation is not None else None

    def not_simulated(self) -> tuple:
        return tuple(self.simulation.not_simulated) if self.simulation is not None else ()

    def disk_paused(self) -> Any:
        """The doctor's own writes (the report file) go to the real disk."""
        return self.disk.paused() if self.disk is not None else contextlib.nullcontext()

    def put_away_writes(self) -> None:
        """After the script: what it wrote is kept where --keep-writes says, and the scratch directory goes."""
        try:
            if self.keep_writes is not None:
                self.kept = self.disk.keep(self.keep_writes)
        finally:
            self.disk.cleanup()

    def environment(self, environment: dict) -> dict:
        """The report's environment: a simulated or hidden CUDA says whether the real machine has one."""
        if self.placement.simulated or self.hide_cuda:
            return {**environment, "cuda_available": real_cuda_available()}
        return environment


@contextlib.contextmanager
def hidden_cuda() -> Any:
    """`run --device cpu` on a machine with a GPU: the script sees none, as on a CPU-only machine."""
    cuda = torch.cuda
    saved = {name: cuda.__dict__[name] for name in ("is_available", "device_count")}
    cuda.is_available = lambda: False  # type: ignore[assignment]
    cuda.device_count = lambda: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cuda, name, fn)


_REAL_IS_AVAILABLE = torch.cuda.is_available


def real_cuda_available() -> bool:
    return bool(_REAL_IS_AVAILABLE())
