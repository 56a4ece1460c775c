"""What benchmarks/sweep_whole_step.py found besides the saved statistics (test_saved_for_backward.py),
each shown in plain PyTorch (or plain transformers) first, then mended.

- diagnose() left transformers' output-capturing hooks on the model: the next call installed them
  again and collected every hidden state twice (segformer's decode head then met the wrong one).
- A value read the simulation stepped over in the forward (`if mask.any():`) hid every refusal
  of the backward (DD100 took it for a refused forward); and a backward's own mixed-dtype matmul
  was dropped in any trace (DD101, which explains matmuls, reports forward ops only).
- `_grouped_mm`'s fake kernel takes bfloat16 only; this CPU's kernel and CUDA's take any float
  (CUDA's `_grouped_mm_fallback`, GroupedBlas.cpp): a float16 or float32 MoE step was refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtype_doctor
from helpers_models import Call


def errors(report) -> list[str]:  # noqa: ANN001
    return sorted({f.code for f in report.findings if f.severity == "error"})


def tiny_bert():  # noqa: ANN201
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=50,
                        max_position_embeddings=16)
    return BertModel(config).eval()


@pytest.mark.parametrize("simulate", [False, True], ids=["real", "simulated"])
def test_diagnose_leaves_no_hooks_behind(simulate: bool) -> None:
    model = tiny_bert()
    ids = {"input_ids": torch.randint(0, 50, (1, 6))}
    hooks = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    dtype_doctor.diagnose(model, ids, simulate=simulate, device="cuda" if simulate else None)
    assert {name: len(m._forward_hooks) for name, m in model.named_modules()} == hooks
    # transformers installs its hooks on the model's first call: once, so each hidden state once.
    assert len(model(**ids, output_hidden_states=True).hidden_states) == 3
    assert len(model(**ids, output_hidden_states=True).hidden_states) == 3


class HalfBackward(torch.autograd.Function):
    """A backward that computes in float32 against a half weight: refused on any device."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(w)
        return x @ w

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        (w,) = ctx.saved_tensors
        return grad.float() @ w.t(), None


class BranchThenHalfBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(4, 4, dtype=torch.float16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x > 0).any():  # a value read: the simulation takes one branch (DD001 info)
            x = x * 2
        return HalfBackward.apply(x, self.w)


def test_a_value_read_in_the_forward_does_not_hide_a_backward_refusal() -> None:
    model, x = BranchThenHalfBackward(), torch.rand(2, 4, dtype=torch.float16, requires_grad=True)
    with pytest.raises(RuntimeError):
        model(x).float().sum().backward()  # the real step refuses in its backward
    # DD101 explains a mixed-dtype matmul in the forward only: the backward's is DD100's.
    assert errors(dtype_doctor.diagnose(model, {"x": x}, train=True)) == ["DD100"]
    report = dtype_doctor.diagnose(model, {"x": x}, train=True, simulate=True, device="cuda")
    assert "DD001" in {f.code for f in report.findings if f.severity == "info"}
    refused = [f for f in report.findings if f.severity == "error"]
    assert refused and {t.dtype for f in refused for t in f.tensors} >= {"float32", "float16"}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_grouped_mm_of_any_float_runs_here_and_on_a_simulated_gpu(dtype: torch.dtype) -> None:
    x, w = torch.rand(16, 32, dtype=dtype), torch.rand(2, 32, 64, dtype=dtype)
    offs = torch.tensor([8, 16], dtype=torch.int32)
    assert F.grouped_mm(x, w, offs=offs).dtype == dtype  # this CPU's kernel runs it
    with pytest.raises(RuntimeError):  # the fake (meta) kernel wants bfloat16
        torch._grouped_mm(x.to("meta"), w.to("meta"), offs=offs.to("meta"))
    call = Call(lambda x, w, offs: F.grouped_mm(x, w, offs=offs))
    report = dtype_doctor.diagnose(call, {"x": x, "w": w, "offs": offs}, simulate=True, device="cuda")
    assert errors(report) == []
    [op] = [o for o in report.trace.ops if o.op == "aten._grouped_mm.default"]
    assert op.error is None and [t.dtype for t in op.outputs] == [str(dtype).removeprefix("torch.")]


def test_a_target_refusal_of_an_op_whose_fake_kernel_is_stricter_is_still_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were CUDA to refuse what this CPU runs (the table's verdict) on an op whose fake kernel is
    stricter still, the refusal stands: the fake kernel's own strictness is no reason to drop it."""
    from dtype_doctor.trace.probe import KernelProbe

    plain = KernelProbe.__call__

    def refusing(self, func, args, kwargs, op):  # noqa: ANN001, ANN202
        verdict = plain(self, func, args, kwargs, op)
        if op.op == "aten._grouped_mm.default":
            assert self.last_accepted  # this CPU's kernel ran it
            return "\"_grouped_mm\" has no CUDA kernel for float16 (a stand-in for a table row)"
        return verdict

    monkeypatch.setattr(KernelProbe, "__call__", refusing)
    x, w = torch.rand(16, 32, dtype=torch.float16), torch.rand(2, 32, 64, dtype=torch.float16)
    call = Call(lambda x, w, offs: F.grouped_mm(x, w, offs=offs))
    report = dtype_doctor.diagnose(call, {"x": x, "w": w, "offs": torch.tensor([8, 16], dtype=torch.int32)},
                                   simulate=True, device="cuda")
    assert errors(report) == ["DD107"]  # reported, and the trace went on past it
    [op] = [o for o in report.trace.ops if o.op == "aten._grouped_mm.default"]
    assert op.error is not None and op.recovered
