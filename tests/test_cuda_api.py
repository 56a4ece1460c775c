"""The CUDA API surface as data (machine/cuda_api.py): every public name of the installed torch's
CUDA modules has a row, and each answered row answers as the simulated GPU under `run --simulate`."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from dtype_doctor.cli.main import run
from dtype_doctor.machine.cuda_api import ANSWERED, NOT_SIMULATED, OWN, SURFACE

_OWN_PREFIXES = ("torch.cuda", "torch.accelerator", "torch.backends", "torch._C")


def _public(module_name: str) -> set[str]:
    """The names a script can reach: __all__, and every public name the module defines itself or takes
    from torch's CUDA code (not `typing.Any`, `os`, or torch.Tensor imported for annotations)."""
    module = importlib.import_module(module_name)
    names = set(getattr(module, "__all__", ()))
    real = getattr(module, "m", None) if module_name == "torch.backends.cudnn" else None
    if real is not None:  # a PropModule: its functions on .m, its flags as properties of its class
        names |= {n for n, v in vars(type(module)).items() if not n.startswith("_") and type(v).__name__ in ("ContextProp", "property")}
        module = real
    for name in dir(module):
        if name.startswith("_") or name in names or name == "TYPE_CHECKING":
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            continue  # a submodule: walked itself where it is the CUDA API's
        owner = value.__module__ if isinstance(value, type) or callable(value) else getattr(type(value), "__module__", "")
        if owner in ("builtins",) or owner.startswith(_OWN_PREFIXES):
            names.add(name)
    return {n for n in names if not isinstance(getattr(module, n, None), types.ModuleType)}


@pytest.mark.parametrize("module_name", sorted(SURFACE))
def test_every_public_name_of_the_installed_torch_has_a_row(module_name: str) -> None:
    missing = sorted(_public(module_name) - set(SURFACE[module_name]))
    # A new torch release that adds a CUDA function fails here: give it an answer or a NOT_SIMULATED row.
    assert not missing, f"{module_name}: no row for {missing} in machine/cuda_api.py"


def test_the_table_has_no_row_for_a_name_torch_does_not_have() -> None:
    for module_name, rows in SURFACE.items():
        module = importlib.import_module(module_name)
        reachable = set(dir(getattr(module, "m", module))) | set(dir(type(module)))
        assert not (set(rows) - reachable), (module_name, set(rows) - reachable)
        assert set(rows.values()) <= ANSWERED | {OWN, NOT_SIMULATED}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict | None, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


# Every answered row called as a script would: on this CPU-only build each raises or answers "no GPU".
EVERY_ANSWER = """\
import importlib, torch
from dtype_doctor.machine.cuda_api import SURFACE, ANSWERED
x = torch.randn(2, 8).cuda()
calls = {
    "can_device_access_peer": (0, 0), "set_device": (0,), "set_device_index": (0,), "set_device_idx": (0,),
    "manual_seed": (1,), "manual_seed_all": (1,), "set_rng_state": (torch.zeros(16, dtype=torch.uint8),),
    "set_rng_state_all": ([torch.zeros(16, dtype=torch.uint8)],), "set_stream": (None,), "stream": (None,),
    "StreamContext": (None,), "ExternalStream": (0,), "get_stream_from_external": (0,), "device": (0,), "device_of": (x,),
    "device_index": (0,), "set_sync_debug_mode": (0,), "set_per_process_memory_fraction": (0.5,), "check_error": (0,),
    "range_push": ("r",), "range_start": ("r",), "range_end": (0,), "mark": ("m",), "range": ("r",), "is_acceptable": (x,),
    "can_use_flash_attention": (None,), "can_use_efficient_attention": (None,),
}
answered = 0
for module_name, rows in SURFACE.items():
    module = importlib.import_module(module_name)
    for name, kind in rows.items():
        if kind in ANSWERED and hasattr(module, name):
            value = getattr(module, name)
            if callable(value):
                value(*calls.get(name, ()))
            answered += 1
print("answered", answered)
print("accelerator", torch.accelerator.is_available(), torch.accelerator.current_accelerator(), torch.accelerator.device_count())
torch.cuda.random.manual_seed_all(7)
state = torch.cuda.random.get_rng_state()
torch.cuda.manual_seed(8)
torch.cuda.random.set_rng_state(state)  # a checkpoint's saved state, loaded back
print("rng", tuple(state.shape), state.dtype, torch.cuda.initial_seed())
print("cudnn", torch.backends.cudnn.is_available(), torch.backends.cudnn.is_acceptable(x), torch.backends.cuda.is_built())
model = torch.nn.Linear(8, 2).to(torch.accelerator.current_accelerator())
model(x).sum().backward()
torch.cuda.utilization()  # a sensor: no stand-in can say how busy a GPU is
print("not reached")
"""


def test_every_answered_row_answers_and_a_row_not_simulated_is_named(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "api.py").write_text(EVERY_ANSWER)
    # On this CPU-only build the plain calls answer "no GPU" (torch.accelerator) or raise (cudnn is absent).
    assert not torch.accelerator.is_available() and torch.accelerator.current_accelerator() is None
    assert not torch.backends.cudnn.is_available()
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "api.py"], capsys)
    assert "accelerator True cuda 1" in err and "rng (16,) torch.uint8 7" in err and "cudnn True True True" in err
    assert "not reached" not in err
    assert report["coverage"]["not_simulated"] == ["torch.cuda.utilization"]
    assert "torch.cuda.utilization is not simulated" in report["coverage"]["stopped"]
    assert report["trace_failure"]["kind"] == "simulation"


NOT_SIMULATED_CLASS = """\
import torch
model = torch.nn.Linear(8, 2).to("cuda")
model(torch.randn(2, 8, device="cuda")).sum().backward()
assert not isinstance(model.weight, torch.cuda.CUDAGraph)  # isinstance answers as torch's class does
try:
    graph = torch.cuda.CUDAGraph()  # graph capture: no stand-in can replay a kernel
except Exception as e:  # a script that falls back when capture is unavailable
    print("fell back:", type(e).__name__, e)
"""


def test_a_class_not_simulated_is_named_not_blamed_on_the_script(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # On this CPU-only build the class is torch's dummy: making one raises, which a simulated run would have
    # blamed on the script (or the script's fallback would have taken a path a GPU never takes).
    with pytest.raises(RuntimeError, match="dummy base class CUDAGraph"):
        torch.cuda.CUDAGraph()
    (workdir / "graphs.py").write_text(NOT_SIMULATED_CLASS)
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "graphs.py"], capsys)
    assert "fell back" not in err
    assert report["coverage"]["not_simulated"] == ["torch.cuda.CUDAGraph"]
    assert "torch.cuda.CUDAGraph is not simulated" in report["coverage"]["stopped"]


def test_the_walk_covers_every_module_issue_43_names_and_their_own_modules() -> None:
    # torch.accelerator.memory.memory_allocated is the function torch.accelerator re-exports: a row under
    # torch.accelerator alone would leave the submodule's name reaching the CPU build.
    named = {"torch.cuda", "torch.cuda.random", "torch.cuda.memory", "torch.cuda.amp", "torch.cuda.graphs",
             "torch.cuda.streams", "torch.cuda.nvtx", "torch.accelerator", "torch.backends.cuda", "torch.backends.cudnn"}
    own = {f"torch.accelerator.{n}" for n, v in vars(torch.accelerator).items()
           if isinstance(v, types.ModuleType) and v.__name__.startswith("torch.accelerator.") and not n.startswith("_")}
    assert own and named | own <= set(SURFACE)
