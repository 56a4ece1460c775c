"""trace/recovery.py: the repairs that let a trace step over a refused op.

Each repair must be the fix a user would make, and the first repair that the real kernel
accepts is the one the trace goes on with. So every case here runs the refused call for real,
then the repairs in order, and checks which one PyTorch accepts and what it changed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dtype_doctor.trace.recovery import repair, rnn_input_refusal, rnn_input_repaired


def first_accepted(call, op_name: str, operands: list[tuple[torch.Tensor, str | None]], args: tuple, kind: str, kwargs=None):
    """The refused call's first repaired (args, kwargs) that the real kernel accepts, and its result."""
    kwargs = kwargs or {}
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(*args, **kwargs)
    for new_args, new_kwargs in repair(op_name, operands, args, kwargs, kind):
        try:
            return new_args, new_kwargs, call(*new_args, **new_kwargs)
        except (RuntimeError, NotImplementedError):
            continue
    raise AssertionError("no repair was accepted")


def test_an_input_is_cast_to_the_weights_dtype_and_the_weight_is_left_alone() -> None:
    x, w = torch.randn(2, 4), torch.randn(3, 4, dtype=torch.float64)
    (rx, rw), _, out = first_accepted(F.linear, "aten.linear.default", [(x, "input"), (w, "weight")], (x, w), "dtype")
    assert rw is w and rx.dtype == torch.float64 and out.dtype == torch.float64


def test_class_targets_become_int64() -> None:
    logits, target = torch.randn(3, 5).log_softmax(-1), torch.tensor([0, 1, 4], dtype=torch.int32)
    (rl, rt), _, _ = first_accepted(F.nll_loss, "aten.nll_loss_forward.default", [(logits, "input"), (target, "target")], (logits, target), "dtype")
    assert rt.dtype == torch.int64 and rl is logits


def test_floating_indices_become_int64() -> None:
    weight, ids = torch.randn(10, 4), torch.tensor([[1.0, 2.0]])
    (rw, ri), _, out = first_accepted(torch.embedding, "aten.embedding.default", [(weight, "weight"), (ids, "index")], (weight, ids), "dtype")
    assert ri.dtype == torch.int64 and rw is weight and out.shape == (1, 2, 4)


def test_a_mask_of_another_dtype_becomes_bool_or_the_querys_dtype() -> None:
    q = torch.randn(1, 2, 3, 4)
    mask = torch.ones(3, 3, dtype=torch.int64)
    _, kw, _ = first_accepted(
        F.scaled_dot_product_attention, "aten.scaled_dot_product_attention.default",
        [(q, "input"), (mask, "mask")], (q, q, q), "dtype", kwargs={"attn_mask": mask},
    )
    assert kw["attn_mask"].dtype in (torch.bool, q.dtype)


def test_a_dtype_the_kernel_lacks_gets_float32() -> None:
    x = torch.arange(6)
    (rx,), _, out = first_accepted(F.gelu, "aten.gelu.default", [(x, "input")], (x,), "dtype")
    assert rx.dtype == torch.float32 and out.dtype == torch.float32


def test_a_number_beyond_half_range_is_clamped_to_the_largest_finite_value() -> None:
    scores, mask = torch.zeros(2, 2, dtype=torch.float16), torch.tensor([[True, False], [False, True]])
    (_, _, value), _, out = first_accepted(
        torch.Tensor.masked_fill, "aten.masked_fill.Scalar", [(scores, "input"), (mask, "mask")], (scores, mask, -1e10), "overflow"
    )
    assert value == -torch.finfo(torch.float16).max
    assert torch.isfinite(out).all() and out.min().item() == -65504.0


def test_device_repairs_try_the_accelerator_first_then_the_cpu() -> None:
    """As in a simulated CUDA trace: fake tensors on cuda:0 and on the CPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cpu, gpu = torch.zeros(2), torch.zeros(2, device="cuda")
        tried = [
            {str(a.device) for a in args}
            for args, _ in repair("aten.add.Tensor", [(cpu, "input"), (gpu, "input")], (cpu, gpu), {}, "device")
        ]
    assert tried == [{"cuda:0"}, {"cpu"}]


def test_an_rnn_input_of_another_dtype_is_found_before_any_kernel_and_repaired() -> None:
    lstm, x = nn.LSTM(4, 3, batch_first=True).double(), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="dtype"):
        lstm(x)  # nn.RNNBase's own Python check, not a kernel
    message, data, weight = rnn_input_refusal(lstm, (x,), {})
    assert "dtype" in message and data is x and weight.dtype == torch.float64
    args, kwargs = rnn_input_repaired((x,), {}, weight.dtype)
    out, _ = lstm(*args, **kwargs)
    assert out.dtype == torch.float64


def test_a_matching_rnn_input_has_no_refusal() -> None:
    lstm = nn.LSTM(4, 3)
    assert rnn_input_refusal(lstm, (torch.randn(5, 2, 4),), {}) is None
    assert rnn_input_refusal(nn.Linear(2, 2), (torch.randn(2, 2),), {}) is None
