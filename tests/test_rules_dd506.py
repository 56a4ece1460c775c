"""DD506 fp8-scaled-mm-cuda-constraints and DD107's fp8 capability check.

The CPU's torch._scaled_mm accepts every case below (shown here); CUDA's refuses them. The
CUDA verdicts are PyTorch's own (Blas.cpp), measured on an H100 with scripts/fp8_cuda_facts.py;
the `cuda` test checks the rule against the real kernel wherever a GPU runs the suite.
"""

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.rules.dd107_dtype_unsupported_on_device import fp8_supported
from dtype_doctor.machine.gpus import CAPABILITIES

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
# (name, mat1 [M, K], mat2 as [N, K] transposed (column-major) or [K, N] (row-major), dtypes, CUDA refuses)
CASES = [
    ("ok", (16, 32), (48, 32), True, (E4, E4), False),
    ("e4m3 x e5m2", (16, 32), (48, 32), True, (E4, E5), False),
    ("rows of mat1 free", (13, 32), (48, 32), True, (E4, E4), False),
    ("e5m2 x e5m2", (16, 32), (48, 32), True, (E5, E5), True),
    ("mat2 row-major", (16, 32), (32, 48), False, (E4, E4), True),
    ("K=40", (16, 40), (48, 40), True, (E4, E4), True),
    ("N=40", (16, 32), (40, 32), True, (E4, E4), True),
]


class Fp8(nn.Module):
    def __init__(self, a_shape, b_shape, column_major, dtypes, device="cpu") -> None:  # noqa: ANN001
        super().__init__()
        self.b = torch.randn(*b_shape, device=device).to(dtypes[1])
        self.b = self.b.t() if column_major else self.b
        self.dtype = dtypes[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one = torch.ones((), device=x.device)
        return torch._scaled_mm(x.to(self.dtype), self.b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("name,a_shape,b_shape,column_major,dtypes,refused", CASES, ids=[c[0] for c in CASES])
def test_cpu_runs_what_cuda_refuses_and_the_rule_says_which(name, a_shape, b_shape, column_major, dtypes, refused) -> None:
    model, x = Fp8(b_shape=b_shape, a_shape=a_shape, column_major=column_major, dtypes=dtypes), torch.randn(*a_shape)
    assert model(x).dtype == torch.bfloat16  # the CPU kernel accepts every case
    report = dtype_doctor.diagnose(model, {"x": x})
    found = [f for f in report.findings if f.code == "DD506"]
    assert bool(found) == refused
    if found:
        assert found[0].severity == "warning" and "CUDA refuses" in found[0].message


def test_simulated_cuda_trace_reports_an_error() -> None:
    model = Fp8((16, 40), (48, 40), True, (E4, E4))
    report = dtype_doctor.diagnose(model, {"x": torch.randn(16, 40)}, device="cuda", simulate=True, gpu="h100")
    [f] = [f for f in report.findings if f.code == "DD506"]
    assert f.severity == "error" and "divisible by 16" in f.message


@pytest.mark.parametrize("gpu", sorted(CAPABILITIES))
def test_fp8_needs_capability_8_9(gpu: str) -> None:
    model = Fp8((16, 32), (48, 32), True, (E4, E4))
    report = dtype_doctor.diagnose(model, {"x": torch.randn(16, 32)}, device="cuda", simulate=True, gpu=gpu)
    refused = [f for f in report.findings if f.code == "DD107" and "_scaled_mm" in f.message]
    assert bool(refused) == (gpu in {"t4", "v100", "a10", "a100"})
    assert fp8_supported(CAPABILITIES[gpu]) == (gpu in {"l4", "rtx4090", "h100", "h200", "b200", "rtx5090"})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,a_shape,b_shape,column_major,dtypes,refused", CASES, ids=[c[0] for c in CASES])
def test_the_rule_agrees_with_the_cuda_kernel(name, a_shape, b_shape, column_major, dtypes, refused) -> None:
    if not fp8_supported(torch.cuda.get_device_capability()):
        with pytest.raises(RuntimeError, match="compute capability"):
            Fp8(a_shape, b_shape, column_major, dtypes, "cuda")(torch.randn(*a_shape, device="cuda"))
        return
    model, x = Fp8(a_shape, b_shape, column_major, dtypes, "cuda"), torch.randn(*a_shape, device="cuda")
    if refused:
        with pytest.raises((RuntimeError, ValueError)):
            model(x)
    else:
        model(x)


class Fp8Linear(torch.autograd.Function):
    """An fp8 linear as torchao's float8 training runs it: _scaled_mm forward and backward (e5m2 gradients)."""

    @staticmethod
    def forward(ctx, x, w):  # noqa: ANN001, ANN205
        ctx.save_for_backward(x, w)
        one = torch.ones(())
        return torch._scaled_mm(x.to(E4), w.to(E4).t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x, w = ctx.saved_tensors
        one = torch.ones(())
        g = grad.to(E5)
        grad_x = torch._scaled_mm(g, w.to(E4).t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        # the weight's gradient multiplies over the batch: the rows of x become the inner dimension
        grad_w = torch._scaled_mm(g.t().contiguous(), x.to(E4).t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return grad_x.float(), grad_w.float()


class Fp8Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(48, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Fp8Linear.apply(x, self.weight)


def test_the_backward_transposes_a_dimension_the_forward_never_checked() -> None:
    model, x = Fp8Layer(), torch.randn(8, 32)  # 8 rows: free in the forward, the inner dimension of grad_w
    model(x).float().sum().backward()  # the CPU runs both passes
    forward = dtype_doctor.diagnose(model, {"x": x})
    assert "DD506" not in {f.code for f in forward.findings}
    report = dtype_doctor.diagnose(model, {"x": x}, train=True)
    [f] = [f for f in report.findings if f.code == "DD506"]
    assert "divisible by 16" in f.message and "(48x8)" in f.message


# --- torchao's Float8Linear: the torch._scaled_mm inside its float8 tensor subclass ---------------

needs_torchao = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torchao") is None, reason="torchao is not installed (pip install 'dtype-doctor[quant]')"
)


def _torchao_mlp(hidden: int) -> nn.Module:
    from dtype_doctor.cli.output import hold_back_import_noise

    hold_back_import_noise()  # a CPU build of torch: torchao logs its CUDA extensions as it imports
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, hidden), nn.ReLU(), nn.Linear(hidden, 16))
    return convert_to_float8_training(model)


@needs_torchao
def test_torchao_layers_are_judged_by_their_scaled_mm() -> None:
    """torchao's Float8Linear multiplies through aten.mm on its Float8TrainingTensor, whose handler
    calls torch._scaled_mm on the float8 data: the trace records that call, once per matmul."""
    model, x = _torchao_mlp(40), torch.randn(16, 32)
    assert [type(m).__name__ for m in model] == ["Float8Linear", "ReLU", "Float8Linear", "ReLU", "Float8Linear"]
    assert model(x).dtype == torch.float32  # the CPU runs all of it
    report = dtype_doctor.diagnose(model, {"input": x}, device="cuda", simulate=True, gpu="h100")
    scaled = [op for op in report.trace.ops if op.op == "aten._scaled_mm.default"]
    assert [op.module for op in scaled] == ["0", "2", "4"]  # one per layer: recorded once, not twice
    assert [(op.operands[0].dtype, op.operands[1].shape) for op in scaled] == [
        ("float8_e4m3fn", (32, 48)), ("float8_e4m3fn", (48, 40)), ("float8_e4m3fn", (40, 16))]
    found = [f for f in report.findings if f.code == "DD506"]
    assert {f.severity for f in found} == {"error"}  # N=40 and K=40: the table's refused rows
    assert {r.target for f in found for r in f.remedies} == {"2", "4"}
    assert "DD001" not in {f.code for f in report.findings}
    a100 = dtype_doctor.diagnose(model, {"input": x}, device="cuda", simulate=True, gpu="a100")
    assert any(f.code == "DD107" and "_scaled_mm" in f.message for f in a100.findings)
    real = dtype_doctor.diagnose(model, {"input": x}, train=True)  # a real CPU trace, values measured
    assert "DD001" not in {f.code for f in real.findings}
    assert sum(op.op == "aten._scaled_mm.default" for op in real.trace.ops) == 9  # 3 per layer: out, grad_in, grad_w
    assert {f.severity for f in real.findings if f.code == "DD506"} == {"warning"}


@needs_torchao
def test_a_clean_torchao_conversion_has_no_dd506() -> None:
    model, x = _torchao_mlp(64), torch.randn(16, 32)
    report = dtype_doctor.diagnose(model, {"input": x}, device="cuda", simulate=True, gpu="h100", train=True)
    assert sum(op.op == "aten._scaled_mm.default" for op in report.trace.ops) == 9
    assert not [f for f in report.findings if f.code in ("DD506", "DD001")]
