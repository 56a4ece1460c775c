"""Apple silicon as a simulated target: `--device mps` with `--simulate` (and `--macos`).

This machine has no Mac: torch.backends.mps.is_available() is False here, and a real `mps` tensor
cannot be made (shown first). Simulated, the script sees a Mac (mps available, no CUDA,
torch.accelerator answering mps), its tensors on mps:0, and DD120 names the float64 that a real
MPS refuses (the refusal's source is cited in tests/test_rules_dd120_dd121.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import dtype_doctor
from dtype_doctor.machine.placement import decide
from dtype_doctor.records.errors import UsageError
from dtype_doctor.run.runner import RunOptions, run_script


def test_no_real_mps_here_and_decide_refuses_it_without_simulate():
    assert not torch.backends.mps.is_available()
    with pytest.raises(UsageError, match="--simulate"):
        decide("mps")


def test_simulated_mps_placement_defaults_to_the_oldest_macos():
    where = decide("mps", simulate=True)
    assert (where.device, where.simulated, where.apple, where.macos) == ("mps:0", True, True, (14, 0))
    assert decide("mps", simulate=True, macos="15.2").macos == (15, 2)
    assert where.aliases == {"meta": "mps:0"}
    for bad in ({"macos": "13.6"}, {"gpu": "a100"}, {"gpus": 2}):
        with pytest.raises(UsageError):
            decide("mps", simulate=True, **bad)
    with pytest.raises(UsageError):
        decide("cuda", simulate=True, macos="14.4")


def test_scan_api_names_float64_on_mps_and_judges_float32_clean():
    model = nn.Linear(4, 2)
    report = dtype_doctor.diagnose(model, {"input": torch.zeros(2, 4, dtype=torch.float64)}, simulate=True, device="mps")
    assert report.target.device == "mps:0"
    assert "DD120" in {f.code for f in report.findings if f.severity == "error"}
    clean = dtype_doctor.diagnose(model, {"input": torch.zeros(2, 4)}, simulate=True, device="mps")
    assert not [f for f in clean.findings if f.severity == "error"]


SCRIPT = """
import numpy as np, torch
from torch import nn
seen = (torch.backends.mps.is_available(), torch.cuda.is_available(), str(torch.accelerator.current_accelerator()))
dev = torch.device("mps")
model = nn.Linear(4, 2).to(dev)
x = torch.from_numpy(np.ones((3, 4))){cast}.to(dev)
out = model(x)
assert seen == (True, False, "mps") and str(out.device) == "mps:0" and out.is_mps and not out.is_cuda, seen
nn.functional.cross_entropy(out, torch.zeros(3, dtype=torch.long, device=dev)).backward()
"""


@pytest.mark.parametrize("cast", ["", ".float()"])
def test_run_script_sees_a_mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cast: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.format(cast=cast))
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps"))
    assert result.report.trace.failure is None and result.report.trace.device == "mps:0"
    errors = {f.code for f in result.report.findings if f.severity == "error"}
    assert errors == ({"DD101", "DD120"} if not cast else set())
    assert list(tmp_path.iterdir()) == [tmp_path / "train.py"]  # a simulated run writes nothing
    if not cast:  # a real Mac refuses the float64 at its copy to mps, the line a cast after it cannot mend
        arrival = [f for f in result.report.findings if f.code == "DD120" and f.stage == "transfer"]
        assert arrival and arrival[0].source.line == 7  # x = torch.from_numpy(...).to(dev)


AUTOCAST = """
import torch
from torch import nn
model = nn.Linear(4, 2).to("mps")
with torch.autocast("mps", dtype=torch.{dtype}):
    out = model(torch.ones(3, 4, device="mps"))
assert out.dtype == torch.{expect}, out.dtype
out.float().sum().backward()
"""


@pytest.mark.parametrize("dtype, expect", [("bfloat16", "bfloat16"), ("float32", "float32")])
def test_autocast_on_mps_takes_half_dtypes_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, expect: str):
    # torch/amp/autocast_mode.py, device_type == "mps": float16/bfloat16 only, else a warning and no autocast.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(AUTOCAST.format(dtype=dtype, expect=expect))
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps"))
    assert result.report.trace.failure is None
    assert result.report.trace.autocast == (dtype if dtype != "float32" else None)


MAC_WORDS = """
import torch
from torch import nn
import torch.nn.functional as F
dev = torch.device("mps")
table = nn.Embedding(10, 16)  # left on the CPU: the mps index is refused
qkv = nn.Linear(16, 48).to(dev)
idx = torch.tensor([[1, 2, 3, 4]], device=dev)
with torch.autocast("mps", dtype=torch.float16):
    q, k, v = qkv(table(idx)).view(1, 4, 3, 2, 8).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out.float().sum().backward()
"""


def test_every_report_line_describes_the_mac_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The trust rule: a report for a machine other than the one asked for is the worst answer. A Mac has no
    # CUDA SDPA backend choice (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp is CUDA's), no CUDA
    # wrapper to name in a device error, and no "Ampere": bfloat16 there is a macOS question.
    from dtype_doctor.report import render

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(MAC_WORDS)
    report = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps")).report
    assert report.target.attention["sdpa_backend"] is None and "a Mac (mps)" in report.target.attention["why"]
    assert {"DD201", "DD403"} <= {f.code for f in report.findings}
    text = render(report, "rich", width=200)
    env = next(line for line in text.splitlines() if "torch 2." in line)  # the runner's own versions, `cuda no`
    said = text.replace(env, "")
    assert "mps:0" in said and not [w for w in ("CUDA", "cuda", "Ampere") if w in said], said


AFTER_THE_STEP = """
import numpy as np, torch
from torch import nn
model = nn.Linear(4, 2).to("mps")
model(torch.ones(3, 4, device="mps")).sum().backward()
with torch.no_grad():
    model(torch.ones(3, 4, device="mps"))
    sample = torch.from_numpy(np.random.randn(3, 4)).to("mps")  # a Mac refuses this float64 copy
"""


def test_a_simulated_mac_says_where_it_stopped_and_what_it_did_not_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The script is stopped at its model's next call (line 7): the float64 copy after it (line 8, which a Mac refuses,
    # tests/test_rules_dd120_dd121.py cites the check) never runs, so the clean step must not read as a clean script.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(AFTER_THE_STEP)
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps"))
    assert not [f for f in result.report.findings if f.severity == "error"]
    assert result.note and "stopped the script at train.py:7" in result.note and "float64 copy to mps" in result.note


NO_CUDA_HERE = """
import torch
def asked():
    out = {}
    for name, fn in [("name", torch.cuda.get_device_name), ("capability", torch.cuda.get_device_capability),
                     ("bf16", torch.cuda.is_bf16_supported), ("memory", torch.cuda.mem_get_info),
                     ("version", lambda: torch.version.cuda), ("cudnn", torch.backends.cudnn.is_available)]:
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = type(e).__name__
    return out
"""


def test_a_simulated_mac_has_no_cuda_in_its_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A Mac's torch is built without CUDA, as this CPU-only build is: its CUDA answers are this build's own
    # (plain, first). Before, the simulated Mac answered as the A100 it runs on: torch.version.cuda "12.8",
    # is_bf16_supported True, get_device_name "NVIDIA A100-SXM4-80GB" (a script picking bf16 by it took a GPU's path).
    namespace: dict = {}
    exec(NO_CUDA_HERE, namespace)
    plain = namespace["asked"]()
    assert plain["version"] is None and plain["bf16"] is False and plain["name"] == "AssertionError"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(NO_CUDA_HERE + f"""
assert asked() == {plain!r}, asked()
model = torch.nn.Linear(4, 2).to("mps")
model(torch.ones(3, 4, device="mps")).sum().backward()
""")
    result = run_script(["python", "train.py"], options=RunOptions(simulate=True, device="mps"))
    assert result.outcome.error is None and result.report.trace.device == "mps:0"
