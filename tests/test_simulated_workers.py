"""DataLoader worker processes under `run --simulate` run as on a GPU machine (machine/workers.py).

The script (tests/scripts/loader_workers.py) has mnist/main.py's loader shape: workers, pinned memory,
batches moved to the device in the loop. Its plain run (a real `run`, the CPU machine) is traced first;
then the simulated A100 with each start method: the workers' CPU batches reach the simulated GPU, the
step is traced, nothing a worker did reaches the terminal or the user's files. A worker that fails is
said by the parent in one line and the run ends (before, every worker died at multiprocessing's socket
bind, their tracebacks spilled onto the terminal and the run waited until the script's time limit).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

SCRIPT = Path(__file__).resolve().parent / "scripts" / "loader_workers.py"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(SCRIPT, tmp_path / "loader_workers.py")
    (tmp_path / "started.log").write_text("the user's log\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_the_plain_run_traces_the_step_with_its_workers(here: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(["run", "--device", "cpu", "-f", "json", "--", "python", "loader_workers.py", "fork"], capsys)
    assert code == 0 and "step on cpu" in err
    assert json.loads(out)["coverage"]["phases"]["backward"]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_simulated_workers_feed_the_simulated_gpu(method: str, here: Path, capsys: pytest.CaptureFixture) -> None:
    """DataLoader warns "'pin_memory' argument is set as true but no accelerator is found" where
    `torch.accelerator.is_available()` is False (torch/utils/data/dataloader.py:656) and pins nothing;
    on the simulated GPU it is True, as on a GPU machine: no warning, and the batches read pinned."""
    persistent = ["persistent"] if method != "fork" else []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, out, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "loader_workers.py",
                               method, *persistent], capsys)
    assert not [w for w in seen if "no accelerator is found" in str(w.message)]
    assert "batch from the workers: cpu torch.float32 pinned" in err
    report = json.loads(out)
    assert code == 0 and "batch from the workers: cpu torch.float32" in err and "step on cuda:0" in err
    assert report["coverage"]["phases"]["backward"] and report["coverage"]["phases"]["optimizer"]
    assert "Traceback" not in err and "FileNotFoundError" not in err
    assert (here / "started.log").read_text() == "the user's log\n"  # every process's top level wrote to scratch
    if method != "fork":  # a spawned worker imports the script again: its write is held back and listed too
        assert any(w["path"] == "started.log" for w in report["writes"])


def test_a_worker_that_fails_is_said_in_one_line(here: Path, capsys: pytest.CaptureFixture) -> None:
    """Each sample holds a lock: the worker's queue feeder cannot pickle the batch, prints a traceback in the
    worker and drops it; the parent would wait for it for ever (multiprocessing/queues.py _feed)."""
    code, out, err = _run(["run", "--simulate", "--gpu", "a100", "--", "python", "loader_workers.py", "fork",
                           "unpicklable"], capsys)
    assert code == 2 and "Traceback" not in err
    [line] = [ln for ln in err.splitlines() if "DataLoader worker process" in ln]
    assert "failed under the simulation: TypeError: cannot pickle '_thread.lock' object" in line


def test_a_worker_that_hangs_blocks_a_plain_loader(tmp_path: Path) -> None:
    """The hang is the dataset's, as on any machine: the plain loader, given a timeout of its own, gives up
    (dataloader.py _get_data: "DataLoader timed out after N seconds"); without one it waits for ever."""
    import subprocess
    import sys

    shutil.copy(SCRIPT, tmp_path / "loader_workers.py")
    probe = ("import sys; sys.argv = ['x', 'fork', 'hang']; import loader_workers as s; from torch.utils.data import DataLoader\n"
             "try:\n    next(iter(DataLoader(s.Rows(), batch_size=4, num_workers=2, collate_fn=s.collate, timeout=1)))\n"
             "except RuntimeError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "DataLoader timed out after 1 seconds" in done.stdout


@pytest.mark.parametrize(("method", "timeout"), [("fork", 4), ("spawn", 10), ("forkserver", 10)])
def test_a_worker_that_hangs_is_named_before_the_timeout(method: str, timeout: int, here: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The loader's wait ends a moment before the run's --timeout would stop it inside DataLoader: one line names
    the worker that owes the batch and where it is (its own stack), and the run stops as a timeout does."""
    persistent = ["persistent"] if method == "spawn" else []
    code, out, err = _run(["run", "--simulate", "--gpu", "a100", "--timeout", str(timeout), "--", "python",
                           "loader_workers.py", method, "hang", *persistent], capsys)
    assert code == 2 and "Traceback" not in err and "Fatal Python error" not in err and 'File "' not in err
    [line] = [ln for ln in err.splitlines() if "DataLoader worker" in ln]
    # A forked worker is in __getitem__ at once; a spawned one may still be importing torch on a loaded machine,
    # and is named wherever it is.
    where = r"which was at loader_workers\.py:\d+ in __getitem__" if method == "fork" else \
        r"(which was at \S+:\d+ in \S+|which had not started yet)"
    assert re.search(rf"ran past --timeout {timeout} s and was stopped at loader_workers\.py:\d+, waiting on DataLoader "
                     rf"worker process 0 \(pid \d+, {method}\) for [\d.]+ s, {where}", line), line


def test_a_hung_spawned_worker_ends_the_real_command_in_one_line(here: Path) -> None:
    """As a user runs it (its own process, where DataLoader's SIGCHLD handler is armed): ending the hung worker
    must not raise "killed by signal" into the script, and nothing else reaches the terminal."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "dtype_doctor.cli.main", "run", "--simulate", "--gpu", "a100", "--timeout",
                           "10", "--", "python", "loader_workers.py", "spawn", "hang", "persistent"],
                          cwd=here, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stderr.splitlines() if not ln.startswith("dtype-doctor: [")]
    assert done.returncode == 2 and len(lines) == 1 and "waiting on DataLoader worker process 0" in lines[0], done.stderr
