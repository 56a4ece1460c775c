"""On a real GPU: every CPU↔CUDA table row, and the simulated verdicts, judged by CUDA's own kernels.

CPU-only CI checks the simulation against PyTorch's declarations (op_db's CUDA dtype lists,
kernel sources); these tests run where a GPU exists (`pytest -m cuda`) and put the same
questions to the real kernels: each table fact is shown on CUDA in plain PyTorch first, then
dtype-doctor is asked three ways — a real trace on CUDA, and a simulated trace for this GPU
from fake tensors — and must give the same verdict. Skipped without CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtype_doctor
import opdb_cases as oc
from helpers_models import Call
from helpers_errors import names_dtypes

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[1]
CUDA = "cuda:0"


def gpu() -> str:
    """This GPU as a --gpu compute capability ("9.0")."""
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def errors(report) -> list[str]:  # noqa: ANN001
    return sorted({f.code for f in report.findings if f.severity == "error"})


def both(model: nn.Module, inputs: dict, **options) -> tuple[list[str], list[str]]:  # noqa: ANN003
    """The error codes of a real trace on this GPU and of a simulated one for it."""
    real = dtype_doctor.diagnose(model, inputs, device=CUDA, **options)
    sim = dtype_doctor.diagnose(model, inputs, simulate=True, device="cuda", gpu=gpu(), **options)
    return errors(real), errors(sim)


def on_cuda(inputs: dict) -> dict:
    return {k: v.to(CUDA) for k, v in inputs.items()}


# ------------------------------------------------------------------ the table's rows


def test_integer_mm_has_no_cuda_kernel() -> None:
    a = torch.arange(4).view(2, 2)
    torch.mm(a, a)  # this CPU runs it
    with pytest.raises(RuntimeError):
        torch.mm(a.to(CUDA), a.to(CUDA))
    assert both(Call(lambda a, b: torch.mm(a, b)), {"a": a, "b": a}) == (["DD107"], ["DD107"])


def test_conv_bias_of_another_dtype_is_refused_by_cudnn() -> None:
    x, w, b = torch.rand(1, 2, 5, 5), torch.rand(3, 2, 3, 3), torch.rand(3).half()
    with pytest.raises(RuntimeError) as info:
        F.conv2d(x.to(CUDA), w.to(CUDA), b.to(CUDA))
    assert names_dtypes(str(info.value), "float32", "float16")
    real, sim = both(Call(lambda x, w, b: F.conv2d(x, w, b)), {"x": x, "w": w, "b": b})
    assert real and real == sim, (real, sim)


@pytest.mark.parametrize("return_indices", [False, True])
def test_integer_max_pool1d_is_refused_on_cuda_either_way(return_indices: bool) -> None:
    x = torch.arange(8).view(1, 1, 8).int()
    with pytest.raises((RuntimeError, NotImplementedError)):
        F.max_pool1d(x.to(CUDA), 2, return_indices=return_indices)
    assert both(Call(lambda x: F.max_pool1d(x, 2, return_indices=return_indices)), {"x": x}) == (["DD107"], ["DD107"])


def test_grad_scaler_refuses_bf16_gradients_on_cuda() -> None:
    model, x = nn.Linear(4, 2).to(CUDA, torch.bfloat16), torch.randn(3, 4, device=CUDA)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
    scaler.scale(loss).backward()
    with pytest.raises(RuntimeError):
        scaler.unscale_(opt)
        torch.cuda.synchronize()
    model = nn.Linear(4, 2).to(torch.bfloat16)
    real, sim = both(model, {"input": torch.randn(3, 4)}, train=True, autocast="float16")
    assert "DD401" in real and "DD401" in sim, (real, sim)


def test_cuda_autocast_runs_layer_norm_in_fp32() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(torch.bfloat16)
    x = torch.rand(2, 4)
    with torch.autocast("cuda", dtype=torch.float16):
        out = model.to(CUDA)(x.to(CUDA))  # CUDA autocast runs it (CPU autocast refuses, test_oracle)
    assert out.dtype == torch.float32
    model = model.cpu()
    for mode in ({"device": CUDA}, {"simulate": True, "device": "cuda", "gpu": gpu()}):
        report = dtype_doctor.diagnose(model, {"input": x}, autocast="float16", **mode)
        assert errors(report) == [], (mode, report.findings)
        norm = next(op for op in report.trace.ops if "layer_norm" in op.op)
        assert {t.dtype for t in norm.operands} == {"float32"}, (mode, norm.operands)


def test_cuda_autocast_refuses_binary_cross_entropy() -> None:
    head = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    x, y = torch.rand(2, 4), torch.rand(2, 4)
    with pytest.raises(RuntimeError, match="unsafe to autocast"), torch.autocast("cuda", dtype=torch.float16):
        F.binary_cross_entropy(head.to(CUDA)(x.to(CUDA)), y.to(CUDA))
    call = Call(lambda x, y: F.binary_cross_entropy(call.head(x), y))
    call.head = head.cpu()
    assert both(call, {"x": x, "y": y}, autocast="float16") == (["DD100"], ["DD100"])


def test_cuda_autocast_refuses_two_half_dtypes_in_a_promote_op() -> None:
    a, b, c = torch.rand(3).half(), torch.rand(3).bfloat16(), torch.rand(3).half()
    with pytest.raises(RuntimeError, match="prioritize"), torch.autocast("cuda", dtype=torch.float16):
        torch.addcmul(c.to(CUDA), a.to(CUDA), b.to(CUDA))
    real, sim = both(Call(lambda a, b, c: torch.addcmul(c, a, b)), {"a": a, "b": b, "c": c}, autocast="float16")
    assert real and real == sim, (real, sim)


def test_bf16_matmul_and_attention_run_on_this_gpu() -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the bf16 rows for sm_80 and later")
    q = torch.rand(1, 2, 4, 8).to(torch.bfloat16)
    F.scaled_dot_product_attention(q.to(CUDA), q.to(CUDA), q.to(CUDA))
    real, sim = both(Call(lambda q: F.scaled_dot_product_attention(q, q, q)), {"q": q})
    assert real == sim == []
    model = nn.Linear(4, 2).to(torch.bfloat16)
    real = dtype_doctor.diagnose(model, {"input": torch.rand(3, 4).bfloat16()}, device=CUDA)
    sim = dtype_doctor.diagnose(model, {"input": torch.rand(3, 4).bfloat16()}, simulate=True, device="cuda", gpu=gpu())
    assert [f.code for f in real.findings if f.code == "DD107"] == [f.code for f in sim.findings if f.code == "DD107"] == []


def test_a_batch_left_on_the_cpu_is_a_device_mismatch_on_cuda() -> None:
    model, x = nn.Linear(3, 2), torch.rand(2, 3)
    with pytest.raises(RuntimeError, match="same device"):
        model.to(CUDA)(x)
    model = model.cpu()
    real = dtype_doctor.diagnose(model, {"input": x}, device=CUDA, move_inputs=False)
    sim = dtype_doctor.diagnose(model, {"input": x}, simulate=True, device="cuda", gpu=gpu(), move_inputs=False)
    assert errors(real) == errors(sim) == ["DD201"], (real.findings, sim.findings)


# ------------------------------------------------------------------ op_db, judged by CUDA

# Built only where a GPU is (op_db's samples take a minute to draw on a 2-core runner).
CASES = oc.sampled(90, per_op=2, seed=9) + oc.sampled_modules(30, per_module=2, seed=9) if torch.cuda.is_available() else []


@pytest.mark.parametrize("case", CASES, ids=str)
def test_real_and_simulated_verdicts_agree_with_the_cuda_kernel(case: oc.Case) -> None:
    cpu = oc.real_error(case)
    if cpu is not None and oc.simulation_limit(case, cpu):
        pytest.skip(oc.simulation_limit(case, cpu))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cuda = oc.real_error(case, CUDA)
        real = oc.errors_in(oc.doctor_report(case, device=CUDA))
        sim = oc.errors_in(oc.doctor_report(case, simulate=True, device="cuda", gpu=gpu()))
    assert bool(real) == (cuda is not None), f"real trace on CUDA vs the kernel: {cuda!r}; doctor: {[f.message for f in real]}"
    if not oc.simulation_limit(case, cuda):
        assert bool(sim) == (cuda is not None), f"simulated vs the kernel: {cuda!r}; doctor: {[f.message for f in sim]}"


# ------------------------------------------------------------------ the command line


def scan(*extra: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "dtype_doctor", "scan", "fixtures/demo/model", "fixtures/demo/data",
                           "--format", "json", *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    return json.loads(done.stdout)


def test_the_demo_on_this_gpu_and_simulated_for_it_agree() -> None:
    real, sim = scan("--device", "cuda"), scan("--simulate", "--gpu", gpu())
    assert real["target"]["device"] == sim["target"]["device"] == CUDA
    assert not real["target"]["simulated"] and sim["target"]["simulated"]
    assert [(f["code"], f["module"], f["stage"]) for f in real["findings"]] == [(f["code"], f["module"], f["stage"]) for f in sim["findings"]]
    [dd101] = [f for f in real["findings"] if f["code"] == "DD101"]
    assert names_dtypes(dd101["pytorch_error"], "float32", "float16")


# ------------------------------------------------------------------ a whole training step, run for real


SCRIPTS = ROOT / "tests" / "scripts"
LLAMA = str(ROOT / "fixtures" / "models" / "llama-tiny")
# The realistic scripts (tests/test_run_realistic.py) pick CUDA where it is: `run` traces them on this
# GPU for real, `run --simulate --gpu <this GPU>` from fake tensors; the verdicts must be the same.
STEPS = [
    ("gpt_trainer.py",), ("gpt_trainer.py", "--dtype=float16", "--half"), ("gpt_trainer.py", "--int32-targets"),
    ("gpt_trainer.py", "--cpu-batch"), ("accelerate_loop.py",), ("accelerate_loop.py", "--half"),
    ("accelerate_loop.py", "--int32-labels"), ("trainer_fp16.py", LLAMA, "out"), ("trainer_fp16.py", LLAMA, "out", "--fp32"),
]


def run_json(*argv: str, cwd: Path) -> tuple[int, dict, str]:
    done = subprocess.run([sys.executable, "-m", "dtype_doctor", "run", *argv], cwd=cwd, capture_output=True, text=True, timeout=300)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else {}), done.stderr


@pytest.mark.parametrize("argv", STEPS, ids=[" ".join(a for a in s if not a.startswith("/")) for s in STEPS])
def test_a_training_step_on_this_gpu_and_simulated_for_it_agree(argv: tuple[str, ...], tmp_path: Path) -> None:
    import shutil

    import numpy as np

    (tmp_path / "data").mkdir()
    for split in ("train", "val"):
        np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16).tofile(tmp_path / "data" / f"{split}.bin")
    shutil.copy(SCRIPTS / argv[0], tmp_path / argv[0])
    real_code, real, real_err = run_json("-f", "json", "--", "python", *argv, cwd=tmp_path)
    sim_code, sim, sim_err = run_json("--simulate", "--gpu", gpu(), "-f", "json", "--", "python", *argv, cwd=tmp_path)
    if not real:
        plain = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        if plain.returncode != 0 and "before calling a model" in real_err:
            pytest.skip(f"the script itself fails on this machine: {plain.stderr.strip().splitlines()[-1][:200]}")
    assert real and sim, (real_err[-800:], sim_err[-800:])
    assert real["target"]["device"].startswith("cuda") and not real["target"]["simulated"]

    def verdict(report: dict) -> list[tuple[str, str]]:
        # Values rules (DD301-DD303) judge measured numbers, which a simulation does not have.
        return sorted({(f["code"], f["severity"]) for f in report["findings"]
                       if f["severity"] in ("error", "warning") and not f["code"].startswith("DD30")})

    assert verdict(real) == verdict(sim), {"real": real["findings"], "simulated": sim["findings"]}
    assert real_code == sim_code
    if any(s == "error" for _, s in verdict(real)):
        plain = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert plain.returncode != 0, "an error the real GPU run reports kills the plain script"
