"""One Placement, decided once (dtype_doctor/machine/placement.py): the decision table, the one refusal,
and no other module asking torch whether CUDA is there in order to choose a device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import dtype_doctor
from dtype_doctor.errors import UsageError
from dtype_doctor.machine.placement import Placement, decide, parse_device

PACKAGE = Path(dtype_doctor.__file__).parent


@pytest.fixture(params=[False, True], ids=["no-gpu", "gpu"])
def cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """This machine with and without a GPU, as torch answers the question."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: request.param)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if request.param else 0)
    return request.param


@pytest.mark.parametrize(
    ("device", "simulate", "with_gpu", "without_gpu"),
    [
        ("auto", False, "cuda:0", "cpu"),
        ("cpu", False, "cpu", "cpu"),
        ("cuda", False, "cuda:0", None),
        ("cuda:1", False, "cuda:1", None),
        ("auto", True, "cuda:0", "cuda:0"),
        ("cuda", True, "cuda:0", "cuda:0"),
        ("cuda:3", True, "cuda:3", "cuda:3"),  # a simulated machine has the GPUs it is told of
        ("cpu", True, "cpu", "cpu"),
        (None, False, None, None),  # the API without device=: wherever the model is
    ],
)
def test_the_decision_table(cuda: bool, device, simulate: bool, with_gpu, without_gpu) -> None:
    expected = with_gpu if cuda else without_gpu
    if expected is None and device is not None:
        with pytest.raises(UsageError, match="--simulate"):
            decide(device, simulate=simulate)
        return
    assert decide(device, simulate=simulate, gpu="t4" if simulate else None) == Placement(expected, simulate, "t4" if simulate else None)


def test_an_index_beyond_the_gpus_there_is_refused(cuda: bool) -> None:
    with pytest.raises(UsageError, match="does not exist" if cuda else "not available"):
        decide("cuda:5")


@pytest.mark.parametrize("device", ["tpu", "gpu7", "cuda:", "cuda:x", "CUDA", "mps"])
def test_unknown_devices_are_usage_errors(device: str) -> None:
    with pytest.raises(UsageError, match=f"unknown device '{device}'"):
        parse_device(device)


def test_the_no_cuda_refusal_is_one_error_with_one_line_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """scan's loader, the transfer stage, diagnose and compare refuse a missing GPU alike."""
    from dtype_doctor.compare.engine import REAL_ONLY
    from dtype_doctor.load.batch.transfer import target_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
    calls = {
        "decide": lambda: decide("cuda"),
        "transfer": lambda: target_device("cuda", False),
        "diagnose": lambda: dtype_doctor.diagnose(model, {"input": x}, device="cuda"),
    }
    messages = set()
    for name, call in calls.items():
        with pytest.raises(UsageError) as err:
            call()
        messages.add(str(err.value))
    assert len(messages) == 1, messages
    [message] = messages
    assert "\n" not in message and "--simulate" in message
    with pytest.raises(UsageError, match="compare measures real tensors"):
        dtype_doctor.compare(model, {"input": x}, device="cuda")
    assert REAL_ONLY in str(pytest.raises(UsageError, decide, "cuda", real_only=REAL_ONLY).value)


# Where torch.cuda.is_available() may be asked for something else than choosing a device:
# the report's environment block, the memory estimate's device budget, and what `run` lets the
# script see (a --device cpu run hides the GPU from the script).
NOT_DECIDING = {"diagnosis.py", "load/memory.py", "run/runner.py"}


def test_no_other_module_asks_torch_to_choose_a_device() -> None:
    asking = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_available":
                if isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "cuda":
                    asking.add(str(path.relative_to(PACKAGE)))
    assert asking - NOT_DECIDING == {"machine/placement.py"}, asking
