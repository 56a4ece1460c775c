"""A simulated backward is judged with the dtypes its CUDA forward saved (trace/cuda_table.py
SAVED_FOR_BACKWARD): the forward/backward pairs are probed on this CPU as CUDA runs them.

Each case shows the plain PyTorch calls first: what this CPU's forward saves, what its backward
takes, and what the fake (meta) kernels a simulated trace runs save. Assertions name error
classes and dtypes, never one CPU backend's wording.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dtype_doctor
from dtype_doctor.records import coverage_of
from dtype_doctor.trace.cuda_table import SAVED_FOR_BACKWARD, saved_for_backward, saved_refusal
from helpers_errors import names_dtypes, raises_dtype_error
from helpers_models import Call

aten = torch.ops.aten
HALF = [torch.bfloat16, torch.float16]


def errors(report) -> list[str]:  # noqa: ANN001
    return sorted({f.code for f in report.findings if f.severity == "error"})


def dtypes_of(report, op: str) -> list[tuple[str, ...]]:  # noqa: ANN001
    return [tuple(t.dtype for t in o.outputs) for o in report.trace.ops if o.op == op]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_cpu_layer_norm_saves_half_statistics_and_its_backward_refuses_cudas_float32_ones(dtype: torch.dtype) -> None:
    x, w, b = torch.rand(2, 8, dtype=dtype), torch.ones(8, dtype=dtype), torch.zeros(8, dtype=dtype)
    _, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
    assert mean.dtype == rstd.dtype == dtype  # this CPU saves them in the input's dtype
    # CUDA saves them in float32 (layer_norm_cuda: the accumulate type), as the meta kernel does:
    _, meta_mean, meta_rstd = aten.native_layer_norm(x.to("meta"), [8], w.to("meta"), b.to("meta"), 1e-5)
    assert meta_mean.dtype == meta_rstd.dtype == torch.float32
    # A CPU probe of the backward with what the simulated forward saved would refuse it.
    with raises_dtype_error("float32"):
        aten.native_layer_norm_backward(x, x, [8], mean.float(), rstd.float(), w, b, [True, True, True])
    aten.native_layer_norm_backward(x, x, [8], mean, rstd, w, b, [True, True, True])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_cpu_batch_norm_saves_half_statistics_and_its_backward_refuses_float32_ones(dtype: torch.dtype) -> None:
    x = torch.rand(2, 3, 4, 4, dtype=dtype)
    w, b, rm, rv = (torch.ones(3, dtype=dtype) for _ in range(4))
    _, save_mean, save_invstd = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    assert save_mean.dtype == save_invstd.dtype == dtype
    _, meta_mean, _ = aten.native_batch_norm(*(t.to("meta") for t in (x, w, b, rm, rv)), True, 0.1, 1e-5)
    assert meta_mean.dtype == torch.float32  # batch_norm_cuda's accumulate type
    with raises_dtype_error("float32"):
        aten.native_batch_norm_backward(x, x, w, rm, rv, save_mean.float(), save_invstd.float(), True, 1e-5, [True, True, True])


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize(
    "module",
    [lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), lambda: nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)),
     lambda: nn.Sequential(nn.Conv1d(3, 4, 1), nn.GroupNorm(2, 4)), lambda: nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8))],
    ids=["layer_norm", "batch_norm", "group_norm", "rms_norm"],
)
def test_a_pure_half_norm_trains_clean_here_and_on_a_simulated_gpu(module, dtype: torch.dtype) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    model = module().to(dtype)
    x = torch.rand(2, 3, 4, 4, dtype=dtype) if isinstance(model[0], nn.Conv2d) else (
        torch.rand(2, 3, 5, dtype=dtype) if isinstance(model[0], nn.Conv1d) else torch.rand(2, 8, dtype=dtype))
    model(x).float().sum().backward()  # the real step runs on this CPU
    assert errors(dtype_doctor.diagnose(model, {"input": x}, train=True)) == []
    for gpu in ("t4", "a100", "h100"):
        report = dtype_doctor.diagnose(model, {"input": x}, train=True, simulate=True, device="cuda", gpu=gpu)
        assert errors(report) == [], (gpu, [f.message for f in report.findings])
        assert coverage_of(report.trace).complete


def test_the_simulated_forward_saves_cudas_dtype_and_the_backward_is_asked_with_this_cpus() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).to(torch.bfloat16)
    report = dtype_doctor.diagnose(model, {"input": torch.rand(2, 8, dtype=torch.bfloat16)}, train=True, simulate=True, device="cuda")
    assert dtypes_of(report, "aten.native_layer_norm.default") == [("bfloat16", "float32", "float32")]
    [backward] = [o for o in report.trace.ops if o.op == "aten.native_layer_norm_backward.default"]
    assert [t.dtype for t in backward.operands][:4] == ["bfloat16", "bfloat16", "float32", "float32"] and backward.error is None


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_weight_norm_norms_are_float32_on_cuda_though_the_fake_kernel_saves_float16(dtype: torch.dtype) -> None:
    v, g = torch.rand(4, 3, 5, dtype=dtype), torch.rand(1, 1, 5, dtype=dtype)
    _, norms = aten._weight_norm_interface(v, g, 2)
    assert norms.dtype == torch.float32  # this CPU stashes them as float, as WeightNorm.cu does
    _, meta_norms = aten._weight_norm_interface(v.to("meta"), g.to("meta"), 2)
    assert meta_norms.dtype == (torch.float16 if dtype == torch.float16 else torch.float32)  # the decomposition: bf16 only
    with raises_dtype_error("float32"):
        aten._weight_norm_interface_backward(v, v, g, norms.to(dtype), 2)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(3, 4, 3), dim=2).to(dtype)
    x = torch.rand(2, 3, 8, dtype=dtype)
    report = dtype_doctor.diagnose(conv, {"input": x}, train=True, simulate=True, device="cuda")
    assert errors(report) == []
    assert {d[1] for d in dtypes_of(report, "aten._weight_norm_interface.default")} == {"float32"}


def test_a_backward_given_statistics_cuda_never_saves_is_refused_as_cuda_refuses_it() -> None:
    """native_layer_norm_backward called with bfloat16 statistics: this CPU runs it (its own forward
    saves bf16 ones); CUDA reads them as float32 (`data_ptr<T_ACC>`) and refuses."""
    x, w = torch.rand(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
    stats = torch.ones(2, 1, dtype=torch.bfloat16)

    def backward(x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        return aten.native_layer_norm_backward(x, x, [8], mean, mean, w, None, [True, True, False])[0]

    aten.native_layer_norm_backward(x, x, [8], stats, stats, w, None, [True, True, False])
    call = Call(backward)
    assert errors(dtype_doctor.diagnose(call, {"x": x, "w": w, "mean": stats})) == []
    [f] = [f for f in dtype_doctor.diagnose(call, {"x": x, "w": w, "mean": stats}, simulate=True, device="cuda").findings
           if f.severity == "error"]
    assert f.code == "DD100" and names_dtypes(f.pytorch_error, "float32", "bfloat16")


def test_every_row_names_cudas_source_and_refuses_only_other_dtypes() -> None:
    for entry in SAVED_FOR_BACKWARD:
        assert entry.source.startswith("aten/src/ATen/native/cuda/") and entry.source.split(":")[0].endswith(".cu")
        for backward in entry.backwards:
            assert saved_for_backward(backward) is entry
    layer_norm = saved_for_backward("native_layer_norm_backward")
    assert saved_refusal(layer_norm, {"input": "float16", "mean": "float32", "rstd": "float32"}) is None
    assert saved_refusal(layer_norm, {"input": "float64", "mean": "float64", "rstd": "float64"}) is None
    assert names_dtypes(saved_refusal(layer_norm, {"input": "float16", "mean": "float16", "rstd": "float16"}), "float32", "float16")


@pytest.mark.parametrize("dtype,gpu", [("bfloat16", "a100"), ("float16", "t4")])
def test_the_readme_ci_example_trains_clean_on_a_simulated_gpu(capsys: pytest.CaptureFixture[str], dtype: str, gpu: str) -> None:
    """`scan bert-tiny text-cls --simulate --device cuda --dtype bfloat16 --train` reported DD100 at
    native_layer_norm_backward; a real CPU scan of the same model is clean."""
    import json
    from pathlib import Path

    from dtype_doctor.cli.main import run

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run(["scan", str(fixtures / "models" / "bert-tiny"), str(fixtures / "data" / "text-cls"), "--simulate", "--device", "cuda",
             "--dtype", dtype, "--gpu", gpu, "--train", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert exit_.value.code == 0 and report["summary"]["error"] == 0, report["findings"]
    assert report["coverage"]["complete"]
