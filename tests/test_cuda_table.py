"""The CPU↔CUDA table rows a real GPU added (benchmarks/oracle_cuda.py on an H100).

Each row is shown on this CPU in plain PyTorch (what the CPU kernel does), then the simulated
CUDA verdict must be the GPU's, and the real CPU trace the CPU's. tests/test_cuda.py puts the
same cases to the CUDA kernels where a GPU exists.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtype_doctor
from dtype_doctor.records import TensorMeta
from dtype_doctor.trace.cuda_table import cuda_kernel_check, on_cuda
from helpers_models import Call
from helpers_errors import names_dtypes


def errors(report) -> list[str]:  # noqa: ANN001
    return sorted({f.code for f in report.findings if f.severity == "error"})


@pytest.mark.parametrize("norm", [nn.LayerNorm(4), nn.GroupNorm(2, 4)], ids=["layer_norm", "group_norm"])
def test_a_half_activation_into_an_fp32_norm_runs_here_and_is_refused_on_cuda(norm: nn.Module) -> None:
    x = torch.rand(2, 4).half()
    assert norm(x).dtype == torch.float16  # this CPU's mixed-type kernel runs it (output in the input's dtype)
    assert errors(dtype_doctor.diagnose(norm, {"input": x})) == []
    report = dtype_doctor.diagnose(norm, {"input": x}, simulate=True, device="cuda")
    [f] = [f for f in report.findings if f.severity == "error"]
    assert f.code == "DD101" and [t.dtype for t in f.tensors] == ["float16", "float32", "float32"]
    assert names_dtypes(f.pytorch_error, "float16", "float32")
    assert any(fix.strategy == "cast-inputs" for fix in f.fixes)
    # Under CUDA autocast the norm runs in float32: nothing to refuse.
    assert errors(dtype_doctor.diagnose(norm, {"input": x}, autocast="float16", simulate=True, device="cuda")) == []


def test_a_half_activation_into_an_fp32_batch_norm_runs_on_cuda_too() -> None:
    """cuDNN's batch norm takes a half input with float32 parameters: no finding either way."""
    bn, x = nn.BatchNorm2d(3).eval(), torch.rand(2, 3, 4, 4).half()
    bn(x)
    assert errors(dtype_doctor.diagnose(bn, {"input": x}, simulate=True, device="cuda")) == []


def test_integer_max_unpool_is_refused_here_and_runs_on_cuda() -> None:
    x, i = torch.arange(8).view(1, 1, 2, 4).int(), torch.tensor([[[[0, 3, 4, 7], [8, 11, 12, 15]]]])
    with pytest.raises(NotImplementedError):
        F.max_unpool2d(x, i, 2)
    call = Call(lambda x, i: F.max_unpool2d(x, i, 2))
    assert errors(dtype_doctor.diagnose(call, {"x": x, "i": i})) == ["DD107"]
    assert errors(dtype_doctor.diagnose(call, {"x": x, "i": i}, simulate=True, device="cuda")) == []


def meta(dtype: str, role: str = "input", shape: tuple[int, ...] = (2, 3)) -> TensorMeta:
    return TensorMeta(dtype, "cuda:0", shape, role)


# cuDNN's kernels have no CPU kernel to probe: a CUDA build of torch routes fake CUDA tensors to
# them (a CPU build to the native kernels, probed for real above), so the table decides.
@pytest.mark.parametrize("x, w, refused", [
    ("float16", "float32", False), ("bfloat16", "float32", False), ("float32", "float32", False),
    ("int32", "float32", True), ("float64", "float32", True), ("float32", "float16", True), ("bfloat16", "float16", True),
])
def test_cudnn_batch_norm_takes_same_types_or_half_with_float32_parameters(x: str, w: str, refused: bool) -> None:
    operands = (meta(x), meta(w, "weight", (3,)), meta(w, "bias", (3,)), meta(w, "buffer", (3,)), meta(w, "buffer", (3,)))
    verdict = on_cuda("aten.cudnn_batch_norm.default", operands, None, None, None, cpu_kernel=False)
    assert (verdict is not None) is refused, verdict
    if refused:
        assert "cudnn_batch_norm" in verdict and names_dtypes(verdict, x, w)


@pytest.mark.parametrize("hidden, refused", [("float32", False), ("float16", True), ("float64", True)])
def test_cudnn_rnn_needs_the_hidden_state_in_the_input_dtype(hidden: str, refused: bool) -> None:
    operands = (meta("float32"), meta("float32", "weight"), meta(hidden), meta(hidden))
    verdict = cuda_kernel_check("_cudnn_rnn", operands)
    assert (verdict is not None) is refused, verdict
    if refused:
        assert "hidden" in verdict and names_dtypes(verdict, "float32", hidden)


def test_cudnn_batch_norm_needs_running_stats_of_the_weights_type() -> None:
    """F.batch_norm with float64 running stats: refused here and, by cuDNN, on CUDA."""
    x, mean, var, w = torch.rand(2, 3), torch.zeros(3).double(), torch.ones(3).double(), torch.ones(3)
    with pytest.raises(RuntimeError):
        F.batch_norm(x, mean, var, w)
    operands = (meta("float32"), meta("float32", "weight", (3,)), meta("float64", "buffer", (3,)), meta("float64", "buffer", (3,)))
    verdict = cuda_kernel_check("cudnn_batch_norm", operands)
    assert verdict is not None and names_dtypes(verdict, "float32", "float64")


def test_a_cpu_index_into_a_cuda_embedding_is_refused_but_advanced_indexing_takes_it() -> None:
    """CUDA's index_select (embedding) refuses a CPU index (seen on an H100: "index is on cpu,
    different from other tensors on cuda:0"); advanced indexing, x[idx], takes one on any device."""
    emb, ids = nn.Embedding(10, 4), torch.tensor([[1, 2]])
    report = dtype_doctor.diagnose(emb, {"input": ids}, simulate=True, device="cuda", move_inputs=False)
    [f] = [f for f in report.findings if f.severity == "error"]
    assert f.code == "DD201" and "index is on cpu" in f.pytorch_error and "meta" not in f.pytorch_error
    report = dtype_doctor.diagnose(Rows(), {"i": torch.tensor([0, 2])}, simulate=True, device="cuda", move_inputs=False)
    assert any(o.op.startswith("aten.index.") for o in report.trace.ops) and errors(report) == [], report.findings


class Rows(nn.Module):
    """Rows of a weight on the (simulated) GPU picked by advanced indexing with the index as given."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.rand(5, 3))

    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return self.table[i]
