"""One Placement, decided once (dtype_doctor/machine/placement.py): the decision table, the one refusal,
and no other module asking torch whether CUDA is there in order to choose a device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import dtype_doctor
from dtype_doctor.records.errors import UsageError
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


@pytest.mark.parametrize("device", ["tpu", "gpu7", "cuda:", "cuda:x", "CUDA", "mps:1"])
def test_unknown_devices_are_usage_errors(device: str) -> None:
    with pytest.raises(UsageError, match=f"unknown device '{device}'"):
        parse_device(device)


def test_the_no_cuda_refusal_is_one_error_with_one_line_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """scan's and run's options, and diagnose, refuse a missing GPU alike, at the entry."""
    from dtype_doctor.compare.engine import REAL_ONLY
    from dtype_doctor.pipeline import ScanOptions
    from dtype_doctor.run.runner import RunOptions

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
    calls = {
        "decide": lambda: decide("cuda"),
        "scan": lambda: ScanOptions(device="cuda").placement,
        "run": lambda: RunOptions(device="cuda").placement,
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
# the report's environment block, the memory estimate's device budget, what `run` lets the
# script see (a --device cpu run hides the GPU from the script), and whether the real GPU of a
# `fix --run` runs bfloat16 (its mixed-precision edit).
# load/lowbit.py reads this process's GPU capability for transformers' MXFP4 check, as transformers does
NOT_DECIDING = {"diagnosis.py", "load/memory.py", "run/runner.py", "run/fix.py", "load/lowbit.py"}


def test_no_other_module_asks_torch_to_choose_a_device() -> None:
    asking = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_available":
                if isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "cuda":
                    asking.add(str(path.relative_to(PACKAGE)))
    assert asking - NOT_DECIDING == {"machine/placement.py"}, asking


# ------------------------------------------------------------------ decided once per entry


class _Decisions:
    """Counts the calls of machine.placement.decide, however a module imported it."""

    def __init__(self) -> None:
        self.calls = 0

    def __enter__(self) -> "_Decisions":
        import sys

        code = decide.__code__

        def profile(frame, event, _arg):  # noqa: ANN001, ANN202
            if event == "call" and frame.f_code is code:
                self.calls += 1

        self._old = sys.getprofile()
        sys.setprofile(profile)
        return self

    def __exit__(self, *_exc: object) -> None:
        import sys

        sys.setprofile(self._old)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("options", [dict(simulate=True, train=True), dict(simulate=True, gpus=2)], ids=["simulate", "gpus-2"])
def test_scan_decides_the_placement_once(options: dict) -> None:
    from dtype_doctor.pipeline import ScanOptions, scan

    with _Decisions() as d:
        report = scan(str(FIXTURES / "models" / "llama-tiny"), str(FIXTURES / "data" / "lm-text"), ScanOptions(**options))
    assert report.target.simulated and report.trace is not None and report.trace.ops
    assert d.calls == 1


def test_the_api_decides_once_and_fix_model_never_again() -> None:
    from dtype_doctor.fix.engine import fix_model

    model, x = torch.nn.Linear(4, 2).half(), torch.randn(3, 4)
    with _Decisions() as d:
        report = dtype_doctor.diagnose(model, {"input": x}, device="cuda", simulate=True)
    assert d.calls == 1 and report.target.device == "cuda:0" and "DD101" in {f.code for f in report.findings}
    with _Decisions() as d:
        result = fix_model(model, {"input": x}, simulate=True, device="cuda")
    assert d.calls == 1 and result.verified


def test_run_decides_once(tmp_path: Path) -> None:
    from dtype_doctor.run.runner import RunOptions, run_script

    script = tmp_path / "step.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 2).cuda()\nm(torch.randn(3, 4, device='cuda')).sum().backward()\n")
    with _Decisions() as d:
        result = run_script(["python", str(script)], options=RunOptions(simulate=True))
    assert d.calls == 1 and result.report.target.simulated


@pytest.mark.parametrize("build_cuda", [None, "12.4"], ids=["cpu-only-build", "cuda-build"])
def test_one_rule_for_where_a_simulated_tensor_lives(build_cuda: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """machine.home.simulated_home, which the trace, run's simulated CUDA, device maps and the loader ask."""
    from dtype_doctor.machine.home import simulated_home
    from dtype_doctor.machine.simulate import stand_in_for

    monkeypatch.setattr(torch.version, "cuda", build_cuda)
    meta = torch.device("meta")
    assert simulated_home("cpu") == torch.device("cpu") and simulated_home("cuda:1", loaded=True) == torch.device("cpu")
    # the trace's fake mode makes CUDA tensors only where the build has CUDA; run's simulation never does
    assert simulated_home("cuda:0", fakes_cuda=True) == (torch.device("cuda:0") if build_cuda else meta)
    assert simulated_home("cuda:1") == meta and stand_in_for(1) == meta
    # several GPUs: cuda:k on meta:k, as a device map's GPU indices and run --gpus N ask
    assert simulated_home(1, indexed=True) == torch.device("meta", 1) == stand_in_for(1, gpus=2)


def test_trace_session_still_takes_probe_gpu_the_keyword_it_had_before_the_placement() -> None:
    import torch

    from dtype_doctor.machine.gpus import gpu_profile
    from dtype_doctor.trace.session import TraceSession

    old = TraceSession(torch.nn.Linear(2, 2), simulated=True, probe_gpu="t4")
    new = TraceSession(torch.nn.Linear(2, 2), placement=decide("cuda", simulate=True, gpu="t4"))
    assert old.simulated and old.predict is not None and old.predict.gpu == new.predict.gpu == gpu_profile("t4")
