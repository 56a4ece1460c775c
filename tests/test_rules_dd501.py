"""DD501 bnb-compute-dtype-slow-path, against real bitsandbytes 4-bit layers on the CPU."""

import logging

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")

import dtype_doctor  # noqa: E402


class Net(nn.Module):
    def __init__(self, compute_dtype: torch.dtype | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=compute_dtype, quant_type="nf4").to("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def matmul_dtype(layer: nn.Module, x: torch.Tensor) -> torch.dtype:
    """The dtype bitsandbytes' 4-bit matmul really received, seen by the dispatcher."""
    seen = []

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if str(func).startswith("bitsandbytes.gemm_4bit"):
                seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    with Spy():
        layer(x)
    return seen[0]


def test_default_compute_dtype_runs_half_inputs_in_float32_without_a_warning(caplog) -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    with caplog.at_level(logging.WARNING, logger="bitsandbytes"):
        layer = Net(torch.float32)  # what transformers passes for BitsAndBytesConfig's default
        assert matmul_dtype(layer, x) == torch.float32 and layer(x).dtype == torch.float16
    assert not [r for r in caplog.records if "Linear4bit" in r.getMessage()]  # bitsandbytes is silent
    with caplog.at_level(logging.WARNING, logger="bitsandbytes"):
        Net(None)(x)  # no compute dtype at all: bitsandbytes' own warning
    assert [r for r in caplog.records if "slow" in r.getMessage()]

    report = dtype_doctor.diagnose(Net(torch.float32), {"x": x})
    [f] = [f for f in report.findings if f.code == "DD501"]
    assert f.severity == "warning" and f.module == "proj"
    assert [t.dtype for t in f.tensors] == ["float16", "float32"]
    assert [(r.strategy, r.to) for r in f.remedies] == [("bnb-compute-dtype", "float16")]
    q = report.target.quantization
    assert (q.method, q.quant_type, q.storage_dtype, q.compute_dtype, q.layers) == ("bitsandbytes-4bit", "nf4", "uint8", "float32", 1)


@pytest.mark.parametrize("compute", [torch.float16, torch.bfloat16])
def test_a_half_compute_dtype_is_not_reported(compute: torch.dtype) -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    assert matmul_dtype(Net(compute), x) == compute
    report = dtype_doctor.diagnose(Net(compute), {"x": x})
    assert "DD501" not in {f.code for f in report.findings}


def test_float32_inputs_are_not_the_slow_path() -> None:
    report = dtype_doctor.diagnose(Net(torch.float32), {"x": torch.randn(4, 64)})
    assert "DD501" not in {f.code for f in report.findings}
