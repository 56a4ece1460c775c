"""DD201 device-mismatch: tensors on different devices meet in one op.

No GPU here: a CUDA target is checked with simulate=True, device="cuda" (fake tensors on a
stand-in device labelled cuda:0). Tensors created in forward without device= land on the
CPU there exactly as they would on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_models import found


class AddPositions(nn.Module):
    def __init__(self, pass_device: bool):
        super().__init__()
        self.pass_device = pass_device

    def forward(self, x):
        device = x.device if self.pass_device else None
        pos = torch.arange(x.shape[1], device=device)  # without device=: always the CPU
        bias = torch.ones(x.shape[-1], device=device)
        return x + pos[:, None] + bias


class Model(nn.Module):
    def __init__(self, pass_device: bool):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.positions = AddPositions(pass_device)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.positions(self.proj(x)))


X = torch.randn(2, 4, 8)


def test_tensors_created_without_device_on_a_cuda_target():
    report = dtype_doctor.diagnose(Model(pass_device=False), {"x": X}, simulate=True, device="cuda")
    assert report.target.device == "cuda:0" and report.target.simulated
    hits = found(report, "DD201")
    assert {(f.module, f.module_type, f.severity, f.stage) for f in hits} == {
        ("positions", "AddPositions", "error", "model-code")
    }
    strays = {next(t.origin for t in f.tensors if t.device == "cpu") for f in hits}
    assert strays == {"created:aten.arange.default@positions", "created:aten.ones.default@positions"}
    assert sorted(f.message.split(":")[1].split(" is on")[0].strip() for f in hits) == [
        "a tensor from arange",
        "a tensor from ones",
    ]
    for f in hits:
        assert {t.device for t in f.tensors} == {"cpu", "cuda:0"}
        assert "cuda:0" in f.message
        assert [x.strategy for x in f.fixes] == ["to-device"]
    assert report.trace.failure is None  # repaired, traced on to the output layer
    assert any(m.name == "out" for m in report.trace.modules)


def test_device_x_device_fixes_it():
    report = dtype_doctor.diagnose(Model(pass_device=True), {"x": X}, simulate=True, device="cuda")
    assert report.findings == ()
    assert report.target.device == "cuda:0"


def test_on_the_cpu_everything_is_on_one_device():
    model = Model(pass_device=False)
    model(X)  # runs on the CPU
    assert dtype_doctor.diagnose(model, {"x": X}).findings == ()


def test_device_mismatch_on_real_tensors():
    """The same mix with real tensors: a meta tensor meets CPU ones; PyTorch raises, DD201 says why."""

    class Stray(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) + torch.zeros(8, device="meta")

    with pytest.raises(RuntimeError, match="device"):
        Stray()(torch.randn(2, 8))
    hits = found(dtype_doctor.diagnose(Stray(), {"x": torch.randn(2, 8)}), "DD201")
    assert [(f.module, f.severity) for f in hits] == [("", "error")]
    assert hits[0].pytorch_error is not None


def test_tensors_created_without_device_under_autocast():
    report = dtype_doctor.diagnose(
        Model(pass_device=False), {"x": X}, simulate=True, device="cuda", autocast="bfloat16"
    )
    assert {f.module for f in found(report, "DD201")} == {"positions"}


def test_moves_and_cpu_indices_are_not_mismatches() -> None:
    """copy_ between devices and CPU index tensors are accepted by PyTorch on CUDA."""

    class Moves(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("buf", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.buf.copy_(torch.ones(4))  # a CPU source copied into a CUDA buffer
            return self.lin(x)[torch.tensor([0, 1])]  # a CPU index into a CUDA tensor

    report = dtype_doctor.diagnose(Moves(), {"x": torch.randn(3, 4)}, simulate=True, device="cuda")
    assert [f for f in report.findings if f.code == "DD201"] == []
