"""Value statistics measured during the trace (trace/values.py): exact extremes, sampled shares."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.records import FP16_TINY
from dtype_doctor.records import merge_stats as merge
from dtype_doctor.trace.values import SAMPLE, ValueProbe


def stats_of(t: torch.Tensor):
    probe = ValueProbe()
    return probe.get(probe.observe(t))


def test_extremes_are_exact_and_shares_are_of_non_zero_values():
    t = torch.tensor([0.0, 0.0, 1e-6, -3e-5, 2.0, -70000.0])
    s = stats_of(t)
    assert s.absmax == 70000.0 and s.finite
    assert s.min_nonzero == torch.tensor(1e-6).item()
    assert s.below_fp16_normal == 2 / 4  # 1e-6 and 3e-5 of the four non-zero values
    assert s.below_fp16_normal_scaled == 0.0  # × 65536 both are normal in fp16
    assert (s.sampled, s.numel) == (6, 6)


def test_non_finite_values_are_seen_even_outside_the_sample():
    t = torch.zeros(100_000)
    t[12_345] = float("inf")  # not on the sampled grid
    s = stats_of(t)
    assert not s.finite and math.isinf(s.absmax)
    assert s.sampled <= SAMPLE and s.numel == 100_000
    t[12_345] = float("nan")
    assert math.isnan(stats_of(t).absmax)


def test_half_and_non_contiguous_tensors():
    t = (torch.arange(20_000, dtype=torch.float32) - 10_000).reshape(100, 200).t().half()
    assert not t.is_contiguous()
    s = stats_of(t)
    assert s.absmax == 10_000.0  # exact over all 20,000
    assert s.sampled <= SAMPLE and 1.0 <= s.min_nonzero < 10.0  # the smallest of the sampled values


def test_a_tensor_written_in_place_is_measured_again():
    probe = ValueProbe()
    t = torch.ones(8)
    first = probe.observe(t)
    t[0] = 5.0
    again = probe.observe(t)
    assert first != again
    assert (probe.get(first).absmax, probe.get(again).absmax) == (1.0, 5.0)
    assert probe.observe(t) == again  # unchanged since: the same handle


def test_merge_keeps_extremes():
    a, b = stats_of(torch.tensor([1.0, 2e-5])), stats_of(torch.tensor([float("inf"), 3.0]))
    m = merge([a, b])
    assert math.isinf(m.absmax) and not m.finite and m.min_nonzero == a.min_nonzero
    assert merge([]) is None


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x) * 100)


def test_ops_and_modules_carry_statistics_in_a_real_trace():
    torch.manual_seed(0)
    model, x = TwoLinear(), torch.randn(2, 4)
    report = dtype_doctor.diagnose(model, {"x": x})
    trace = report.trace
    assert trace.values_measured
    mul = next(op for op in trace.ops if op.op == "aten.mul.Tensor")
    with torch.no_grad():
        expected = (model.a(x) * 100).abs().max().item()
    assert math.isclose(mul.stats.absmax, expected, rel_tol=1e-6)
    b = next(m for m in trace.modules if m.name == "b")
    assert math.isclose(b.input_stats.absmax, expected, rel_tol=1e-6)
    assert report.to_dict()["values"] == {"measured": True, "note": "measured"}


def test_simulated_traces_say_values_were_not_measured():
    report = dtype_doctor.diagnose(TwoLinear(), {"x": torch.randn(2, 4)}, simulate=True, device="cuda")
    assert not report.trace.values_measured
    assert all(op.stats is None for op in report.trace.ops)
    assert report.to_dict()["values"]["measured"] is False
    assert "fake tensors" in report.trace.values


def test_statistics_can_be_turned_off():
    report = dtype_doctor.diagnose(TwoLinear(), {"x": torch.randn(2, 4)}, stats=False)
    assert all(op.stats is None for op in report.trace.ops)
    assert "turned off" in report.trace.values


def test_gradients_are_measured_with_train():
    torch.manual_seed(0)
    report = dtype_doctor.diagnose(TwoLinear(), {"x": torch.randn(2, 4)}, train=True)
    names = {g.name for g in report.trace.grads}
    assert names == {"a.weight", "a.bias", "b.weight", "b.bias"}
    assert all(g.stats.finite and g.stats.absmax > 0 for g in report.trace.grads)
    assert FP16_TINY == torch.finfo(torch.float16).tiny


def test_half_tensors_met_under_another_half_autocast_are_measured():
    # CPU autocast bf16 refuses to stack two fp16 tensors (at::autocast::prioritize): the
    # statistics must not use such ops while the model's autocast is on.
    model = nn.Sequential(nn.Identity(), nn.Linear(4, 4))
    report = dtype_doctor.diagnose(model, {"input": torch.randn(2, 4).half()}, autocast="bfloat16")
    assert report.trace.failure is None and report.trace.values_measured
    identity = next(m for m in report.trace.modules if m.name == "0")
    assert identity.stats is not None and identity.stats.finite


def test_ops_that_only_shrink_their_input_are_bounded_by_it():
    # gelu/relu/where results are never larger than their operands: their exact extremes come
    # from the operands' (one full pass saved), their shares from their own sample.
    class Act(nn.Module):
        def forward(self, x):
            return torch.relu(nn.functional.gelu(x * 3))

    x = torch.tensor([[-2.0, 0.5, 4.0, -1e-6]])
    report = dtype_doctor.diagnose(Act(), {"x": x})
    by_op = {op.op: op for op in report.trace.ops}
    mul, gelu, relu = by_op["aten.mul.Tensor"], by_op["aten.gelu.default"], by_op["aten.relu.default"]
    assert mul.stats.absmax == 12.0
    assert gelu.stats.absmax == 12.0 >= nn.functional.gelu(x * 3).abs().max().item()  # the bound
    assert math.isclose(relu.stats.min_nonzero, nn.functional.gelu(torch.tensor(1.5)).item(), rel_tol=1e-6)  # its own sample
    x[0, 0] = float("inf")
    bad = dtype_doctor.diagnose(Act(), {"x": x}).trace
    assert not next(op for op in bad.ops if op.op == "aten.gelu.default").stats.finite


def test_a_non_finite_operand_does_not_make_a_bounded_result_non_finite():
    class Clear(nn.Module):
        def forward(self, x):
            return torch.relu(x)  # relu(-inf) = 0: finite out of a non-finite input

    x = torch.tensor([[float("-inf"), 2.0, -1.0]])
    assert torch.isfinite(torch.relu(x)).all()
    relu = next(op for op in dtype_doctor.diagnose(Clear(), {"x": x}).trace.ops if op.op == "aten.relu.default")
    assert relu.stats.finite and relu.stats.absmax == 2.0  # from its own sample, as the bound says nothing


class Overwrites(nn.Module):
    """Values past float16's range, below its normals and NaN, written in place (through a
    view, by `t[i] = v`, into a buffer, and into an `out=` tensor) after they were measured."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("acc", torch.full((4, 8), 7.0))

    def forward(self, x):
        h = self.lin(x) * 3000.0  # |h| beyond 65504 once doubled below
        tiny = x * 1e-6  # below float16's smallest normal
        h.add_(1.0)
        h[:, :2].mul_(-40.0)
        h[0, 0] = float("nan")
        self.acc.add_(x)
        out = torch.empty_like(tiny)
        torch.mul(tiny, 1e-3, out=out)
        return torch.relu(h) + out + self.acc


def _plain(t: torch.Tensor) -> tuple[float, float, float]:
    """absmax, min non-zero magnitude and the share of non-zero values below float16's normals, by plain torch."""
    a = t.detach().double().abs()
    nonzero = a[(a > 0) & ~a.isnan()]
    absmax = math.nan if a.isnan().any() else a.max().item()
    return absmax, nonzero.min().item(), ((nonzero < FP16_TINY).sum() / nonzero.numel()).item()


def _same(stats, expected: tuple[float, float, float]) -> bool:
    got = (stats.absmax, stats.min_nonzero, stats.below_fp16_normal)
    return all((math.isnan(g) and math.isnan(e)) or math.isclose(g, e, rel_tol=1e-6) for g, e in zip(got, expected))


def test_statistics_equal_plain_torch_when_tensors_are_written_in_place():
    # An in-place op's version counter moves on only after the recorder has seen the op, so its
    # result is measured anew (not taken for the operand it was), the operands it overwrites are
    # measured before it runs, and an `out=` tensor's old contents count nowhere.
    torch.manual_seed(0)
    model, x = Overwrites(), torch.randn(4, 8)
    x[1, 1] = 0.0
    with torch.no_grad():  # the same steps in plain PyTorch, each state kept
        h0 = model.lin(x) * 3000.0
        h1 = h0 + 1.0
        h2 = h1.clone()
        h2[:, :2] *= -40.0
        h3 = h2.clone()
        h3[0, 0] = float("nan")
        tiny = x * 1e-6
        acc1 = model.acc + x
    assert h2.abs().max() > torch.finfo(torch.float16).max and h3.isnan().any()
    ops = dtype_doctor.diagnose(model, {"x": x}).trace.ops
    assert torch.equal(model.acc, torch.full((4, 8), 7.0))  # diagnose() put the buffer back
    by = lambda name, k=0: [op for op in ops if op.op == name][k]  # noqa: E731
    assert _same(by("aten.mul.Tensor").stats, _plain(h0))
    assert _same(by("aten.add_.Tensor").stats, _plain(h1)) and _same(by("aten.add_.Tensor").operand_stats, _plain(h0))
    assert _same(by("aten.mul_.Tensor").stats, _plain(h2)) and _same(by("aten.mul_.Tensor").operand_stats, _plain(h1))
    assert _same(by("aten.copy_.default").stats, _plain(h3)) and not by("aten.copy_.default").stats.finite
    buffer_add = by("aten.add_.Tensor", 1)
    assert _same(buffer_add.stats, _plain(acc1))
    assert _same(buffer_add.operand_stats, _plain(torch.cat([torch.full((4, 8), 7.0), x]))) # the buffer before, and x
    out = by("aten.mul.out")
    assert _same(out.stats, _plain(tiny * 1e-3)) and out.stats.below_fp16_normal == 1.0
    assert _same(out.operand_stats, _plain(tiny))  # not what empty_like's memory held
