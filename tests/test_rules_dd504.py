"""DD504 bnb-quant-storage-fsdp, against real FSDP flattening (a fake process group, on the CPU)."""

import pytest
import torch
import torch.nn as nn

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")

import dtype_doctor  # noqa: E402


class Net(nn.Module):
    def __init__(self, storage: torch.dtype) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(64, 64).bfloat16().requires_grad_(False)
        self.proj = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_storage=storage).to("cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.head(x))


@pytest.fixture(scope="module")
def fsdp():
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield lambda m: FullyShardedDataParallel(m, device_id=torch.device("cpu"))
    dist.destroy_process_group()


def test_uint8_storage_cannot_be_flattened_with_bf16_params(fsdp) -> None:
    with pytest.raises(ValueError, match="uniform dtype"):
        fsdp(Net(torch.uint8))
    report = dtype_doctor.diagnose(Net(torch.uint8), {"x": torch.randn(2, 64, dtype=torch.bfloat16)})
    [f] = [f for f in report.findings if f.code == "DD504"]
    assert f.severity == "info" and f.module == "proj"
    assert [(r.strategy, r.to) for r in f.remedies] == [("bnb-quant-storage", "bfloat16")]
    assert report.target.quantization.storage_dtype == "uint8"


def test_bf16_storage_is_flattened_and_not_reported(fsdp) -> None:
    fsdp(Net(torch.bfloat16))  # wraps
    report = dtype_doctor.diagnose(Net(torch.bfloat16), {"x": torch.randn(2, 64, dtype=torch.bfloat16)})
    assert "DD504" not in {f.code for f in report.findings}
    assert report.target.quantization.storage_dtype == "bfloat16"
