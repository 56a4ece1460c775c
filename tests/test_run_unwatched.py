"""`dtype-doctor run` after the traced call: a model's repeated call in the step runs unwatched, with
the doctor's modes and hooks off (not only its recorder suspended), and so does the script after the
traced steps under --keep-running; a repeat that needs the repair its first call needed is still watched.

The script distils a float32 student from a teacher it calls twice a step. Its own forward hook on the
teacher notes the torch mode stacks each call runs under (empty in the plain script) and the output's
type. Plain python first: with the teacher converted to torchao's float8 training (its Linear runs on
Float8TrainingTensor, a tensor subclass) the script runs; with a bfloat16 teacher on the float32 batch
it dies of the dtype mismatch.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from helpers_errors import raises_dtype_error

SCRIPT = """\
import sys

import torch
import torch.nn as nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

torch.manual_seed(0)
teacher = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
if sys.argv[1] == "float8":
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(teacher)
else:
    teacher.to(torch.bfloat16)
student = nn.Sequential(nn.Linear(32, 16))
opt = torch.optim.SGD(student.parameters(), lr=0.1)
seen = []
teacher.register_forward_hook(lambda m, a, out: seen.append(
    (len(_get_current_function_mode_stack()), len(_get_current_dispatch_mode_stack()), type(out).__name__)))
x = torch.randn(16, 32)
for step in range(2):
    s = student(x)
    with torch.no_grad():
        t1, t2 = teacher(x), teacher(x.flip(0))
    loss = (s - t1).pow(2).mean() + (s - t2.flip(0)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step", step, "loss", repr(loss.item()), "teacher calls", seen, flush=True)
    seen.clear()
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "distill.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plain(*args: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> list[str]:
    monkeypatch.setattr(sys, "argv", ["distill.py", *args])
    runpy.run_path("distill.py", run_name="__main__")
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict, list[str]]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, json.loads(captured.out), [line for line in captured.err.splitlines() if line.startswith("step ")]


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed (pip install 'dtype-doctor[quant]')")
def test_a_repeat_and_the_steps_after_run_without_the_doctors_modes(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    plain = _plain("float8", monkeypatch=monkeypatch, capsys=capsys)
    assert [line.split(" teacher calls ")[1] for line in plain] == ["[(0, 0, 'Tensor'), (0, 0, 'Tensor')]"] * 2
    code, report, steps = _run(["run", "--keep-running", "-f", "json", "--", "python", "distill.py", "float8"], capsys)
    assert code == 0 and report["summary"]["error"] == 0
    # The teacher's first call is traced (under the doctor's modes); its repeat and the whole of step 2 run
    # with no mode of the doctor's on either stack, the float8 subclass's own handlers as in the plain script.
    [first_step, second_step] = steps
    calls = eval(first_step.split(" teacher calls ")[1])  # noqa: S307 - the script's own repr of a list of tuples
    assert calls[0][0] > 0 and calls[0][1] > 0
    assert calls[1] == (0, 0, "Tensor")
    assert second_step.endswith("teacher calls [(0, 0, 'Tensor'), (0, 0, 'Tensor')]")
    assert [line.split(" teacher calls ")[0] for line in steps] == [line.split(" teacher calls ")[0] for line in plain]  # the same losses, bit for bit
    assert report["coverage"]["skipped"] == {"calls": {"teacher": 1}, "ops": 0, "unwatched": 1}
    assert report["coverage"]["complete"] is True


def test_a_repeat_that_needs_the_first_calls_repair_is_watched(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    with raises_dtype_error("float32", "bfloat16"):
        _plain("bfloat16", monkeypatch=monkeypatch, capsys=capsys)
    code, report, steps = _run(["run", "-f", "json", "--", "python", "distill.py", "bfloat16"], capsys)
    assert code == 1
    assert {f["module"] for f in report["findings"] if f["code"] == "DD101"} == {"teacher.0"}
    # The repeat ran watched and repaired, as its first call was: the step went through to its loss line.
    skipped = report["coverage"]["skipped"]
    assert skipped["calls"] == {"teacher": 1} and "unwatched" not in skipped
    assert report["coverage"]["complete"] is True
    [step] = steps
    calls = eval(step.split(" teacher calls ")[1])  # noqa: S307
    assert all(functions > 0 and dispatch > 0 for functions, dispatch, _ in calls)


def test_modes_aside_takes_only_the_doctors_modes_and_puts_them_back_in_place() -> None:
    import torch
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

    from dtype_doctor.machine.modes import modes_aside, push_function_mode, remove_function_mode

    class Seen(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.calls += 1
            return func(*args, **(kwargs or {}))

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            return func(*args, **(kwargs or {}))

    ours, script = Seen(), Seen()
    dispatch = Dispatch()
    push_function_mode(ours)
    push_function_mode(script)  # the script's own mode, pushed after the doctor's (torch.device("meta") is one)
    try:
        with dispatch:
            with modes_aside([ours], dispatch):
                torch.ones(2) + 1
                assert _get_current_function_mode_stack() == [script] and _get_current_dispatch_mode_stack() == []
            assert _get_current_function_mode_stack() == [ours, script]
            assert _get_current_dispatch_mode_stack() == [dispatch]
        assert ours.calls == 0 and script.calls > 0
    finally:
        remove_function_mode(script)
        remove_function_mode(ours)


def test_hooks_aside_puts_the_doctors_hooks_back_between_the_scripts() -> None:
    import torch

    from dtype_doctor.trace.unseen import hook_dicts, hook_module, hooks_aside, unhook

    order: list[str] = []
    lin = torch.nn.Linear(2, 2)
    lin.register_forward_pre_hook(lambda m, a: order.append("script before"))
    handles = hook_module(lin, lambda m, a, k: order.append("doctor pre"), lambda m, a, k, o: order.append("doctor post"))
    lin.register_forward_pre_hook(lambda m, a: order.append("script after"))
    try:
        with hooks_aside(hook_dicts([lin], handles)):
            lin(torch.ones(1, 2))
            assert order == ["script before", "script after"]
            lin.register_forward_pre_hook(lambda m, a: order.append("script, in the block"))
        order.clear()
        lin(torch.ones(1, 2))
        assert order == ["script before", "doctor pre", "script after", "script, in the block", "doctor post"]
    finally:
        unhook(handles)
