"""mps-float32: `fix --run --simulate --device mps` casts numpy's float64 to float32 where it enters,
before its copy to mps, and verifies it by running the script again.

No Mac here. The plain fact first: the installed torch's own tests quote the refusal a Mac raises
at the copy (torch/testing/_internal/common_methods_invocations.py, "Cannot convert a MPS Tensor to
float64 dtype as the MPS framework doesn't support float64", from aten/src/ATen/native/mps's
getMPSDataType), and real MPS cannot be asked here. A cast at the model call, after the copy, is
too late for a Mac, so the fix must land before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtype_doctor.cli.main import run
from dtype_doctor.fix.codemods.mps import CastBeforeMove
from dtype_doctor.machine.mps_expectations import FLOAT64_ERROR
from test_codemods import applied, skipped, src

TESTING = Path(torch.__file__).parent / "testing" / "_internal"

# A script in the shape of a first training script on a Mac: numpy data (float64 by numpy's default),
# torch.from_numpy, the device chosen by torch.backends.mps.is_available().
NUMPY_SCRIPT = """\
import numpy as np
import torch
from torch import nn

device = torch.device("mps") if torch.backends.mps.is_available() else torch.device("cpu")
rng = np.random.default_rng(0)
features = rng.standard_normal((32, 8))
targets = rng.integers(0, 2, 32)

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.from_numpy(features).to(device)
y = torch.from_numpy(targets).to(device)
for step in range(2):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", loss.item())
"""

# The same data through a TensorDataset and a DataLoader; the loop moves both tensors on one line.
LOADER_SCRIPT = """\
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = "mps" if torch.backends.mps.is_available() else "cpu"
X = np.random.rand(64, 8)
Y = (X.sum(axis=1) > 4).astype(np.int64)
loader = DataLoader(TensorDataset(torch.tensor(X), torch.tensor(Y)), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
opt = torch.optim.Adam(model.parameters())
for xb, yb in loader:
    xb, yb = xb.to(device), yb.to(device)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done")
"""


def test_the_refusal_is_the_one_torch_quotes_and_no_mps_is_here() -> None:
    quoted = (TESTING / "common_methods_invocations.py").read_text()
    assert "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64" in quoted
    assert FLOAT64_ERROR.startswith("Cannot convert a MPS Tensor to float64 dtype")
    assert not torch.backends.mps.is_available()
    with pytest.raises(RuntimeError):  # this torch has no MPS: the copy cannot be tried for real here
        torch.zeros(2, dtype=torch.float64).to("mps")


@pytest.fixture
def workdir(git_workdir: Path) -> Path:
    return git_workdir


def _fix(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict]:
    with pytest.raises(SystemExit) as exit_info:
        run(["fix", "--run", "--simulate", "--device", "mps", "--write-patch", "fix.patch", "-f", "json", *argv])
    out = capsys.readouterr()
    assert out.out, out.err[-3000:]
    return exit_info.value.code, json.loads(out.out)


def _changed(patch: str) -> list[str]:
    return [line[1:].strip() for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize(("script", "expected"), [
    (NUMPY_SCRIPT, ["x = torch.from_numpy(features).to(device)", "x = torch.from_numpy(features).to(torch.float32).to(device)"]),
    (LOADER_SCRIPT, ["xb, yb = xb.to(device), yb.to(device)", "xb, yb = xb.to(torch.float32).to(device), yb.to(device)"]),
], ids=["from-numpy", "dataloader"])
def test_float64_is_cast_before_its_copy_and_verified(workdir: Path, capsys: pytest.CaptureFixture, script: str, expected: list[str]) -> None:
    (workdir / "train.py").write_text(script)
    plainly = script is NUMPY_SCRIPT  # the plain runs once: a second script costs seconds and shows nothing new
    plain = subprocess.run([sys.executable, "train.py"], cwd=workdir, capture_output=True, text=True, timeout=120) if plainly else None
    # On this CPU the step fails at the first Linear (float64 input, float32 weight: DD101); a Mac fails before,
    # at the copy, which is why the cast goes before it.
    assert plain is None or (plain.returncode != 0 and "RuntimeError" in plain.stderr)
    code, report = _fix(["--", "python", "train.py"], capsys)
    arrival = [f for f in report["findings"] if f["code"] == "DD120"]
    assert len(arrival) == 1 and arrival[0]["stage"] == "transfer"  # the copy, not one finding more per op
    assert {r["strategy"] for r in arrival[0]["remedies"]} == {"mps-float32"}
    fix = report["fix"]
    assert code == 0 and fix["verified"] is True, fix
    # The loop calls the model again: a simulated script stops there, and the report says so (not "to its end").
    assert fix["script"]["ran_on"].startswith("to its model's next call after the traced step"), fix
    patch = (workdir / "fix.patch").read_text()
    assert _changed(patch) == expected  # one edit, before the copy: no second cast at the model call
    assert (workdir / "train.py").read_text() == script  # the user's file is the patch's to change
    if not plainly:
        return
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    again = subprocess.run([sys.executable, "train.py"], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr


MOVES = src(
    """
    import torch
    x = torch.tensor(data).to(device)
    x = torch.from_numpy(a).to(device)
    x = torch.tensor(data, device=device)
    xb, yb = xb.to(device), yb.to(device)
    ds = TensorDataset(torch.tensor(X), torch.tensor(Y))
    x = torch.tensor(X)
    x = torch.from_numpy(a).float().to(device)
    """
)


@pytest.mark.parametrize(("line", "nth", "expected"), [
    (2, None, "x = torch.tensor(data).to(torch.float32).to(device)"),  # on the tensor the move is called on
    (3, None, "x = torch.from_numpy(a).to(torch.float32).to(device)"),  # where numpy's float64 enters
    (4, None, "x = torch.tensor(data, device=device, dtype=torch.float32)"),  # made on the device: dtype= there
    (5, 0, "xb, yb = xb.to(torch.float32).to(device), yb.to(device)"),  # several moves: the one asked for
    (7, None, "x = torch.tensor(X, dtype=torch.float32)"),  # made on a line of its own, moved later
])
def test_cast_before_move(line: int, nth: int | None, expected: str) -> None:
    after = applied(CastBeforeMove(line, "float32", nth=nth), MOVES)
    assert after.splitlines()[line - 1] == expected


@pytest.mark.parametrize(("line", "nth", "says"), [
    (5, None, "2 moves could carry the tensor"),  # which one is float64 is not known from the line
    (6, None, "2 tensors are made there"),  # never `.to()` on the TensorDataset
    (8, None, "already cast to torch.float32"),
    (7, 1, "no move to a device"),
])
def test_cast_before_move_skips_what_it_cannot_know(line: int, nth: int | None, says: str) -> None:
    assert says in skipped(CastBeforeMove(line, "float32", nth=nth), MOVES)


def test_no_macos_this_torch_accepts_lacks_bfloat16(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # torch's MPS needs macOS 14 (MPSDevice.mm: MPSDevice() requires an MPSGraph method introduced in 14.0),
    # and bfloat16 needs 14.0: a --macos without bfloat16 is refused in one line, so no fp16-for-bf16 choice is left.
    from dtype_doctor.machine.mps_expectations import BF16_SINCE, expectations

    assert expectations().min_macos >= BF16_SINCE
    (workdir / "train.py").write_text(NUMPY_SCRIPT)
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "--device", "mps", "--macos", "13.5", "--", "python", "train.py"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert [line for line in err.splitlines() if line.strip()] == ["dtype-doctor: error: --macos 13.5: the installed torch's MPS needs macOS 14.0 or newer"]


def test_in_memory_the_input_is_cast_before_the_trace_moves_it(workdir: Path) -> None:
    # `fix MODEL DATASET` applies a strategy to the batch in memory: the float64 input DD120 names becomes float32.
    from dtype_doctor.fix.strategies import STRATEGIES, Context, Pipeline
    from dtype_doctor.run.runner import RunOptions, run_script

    (workdir / "train.py").write_text(NUMPY_SCRIPT)
    report = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps")).report
    strategy = STRATEGIES["mps-float32"]
    pipeline = Pipeline(torch.nn.Linear(8, 2), {"input": torch.zeros(2, 8, dtype=torch.float64)})
    (change,) = strategy.plan(pipeline, report, Context())
    assert (change.target, change.before, change.to) == ("input", "float64", "float32")
    assert strategy.apply(pipeline, (change,)).inputs["input"].dtype == torch.float32
    assert pipeline.inputs["input"].dtype == torch.float64  # the pipeline it was given is not edited
