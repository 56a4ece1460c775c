"""The script's own processes under `run --simulate` (machine/workers.py): pytorch/examples' mnist_hogwild
trains its shared model in `mp.Process` children (spawn), each with a pinning DataLoader.

The plain run (the CPU machine) comes first. Simulated, each child sees the machine the parent sees (a
T4's CUDA, or a Mac) and trains on it: before, each child's DataLoader pin thread ran without the
simulation and failed with "Cannot access accelerator device when none is available" (the pin thread's
`data.pin_memory()`, torch/utils/data/_utils/pin_memory.py), and a simulated Mac's children saw CUDA.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dtype_doctor.run.runner import RunOptions, run_script

SCRIPT = Path(__file__).resolve().parent / "scripts" / "hogwild.py"


@pytest.mark.parametrize("options", [RunOptions(device="cpu"), RunOptions(simulate=True, gpu="t4"),
                                     RunOptions(simulate=True, device="mps")], ids=["plain", "t4", "mps"])
def test_the_scripts_own_processes_train_on_the_machine_asked_for(options: RunOptions, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capfd: pytest.CaptureFixture) -> None:
    shutil.copy(SCRIPT, tmp_path / "hogwild.py")
    monkeypatch.chdir(tmp_path)
    result = run_script(["python", "hogwild.py"], options=options)
    err = capfd.readouterr().err
    assert result.outcome.error is None and result.report.trace.failure is None, result.outcome.error
    assert result.report.trace.device == {"cpu": "cpu", "t4": "cuda:0", "mps": "mps:0"}[options.gpu or options.device]
    assert "Traceback" not in err and "failed" not in err, err  # (a Mac's DataLoader warns that it pins nothing on MPS)
    if options.simulate:  # the report is the parent's step: the children's steps ran, untraced, and the run says so
        assert "the script's own processes ran under the simulation, their steps not traced" in err
        assert "train (spawn)" in err and "_worker_loop" not in err
