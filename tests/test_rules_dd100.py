"""DD100 kernel-rejected-operands: a refusal no more specific rule explains.

Judged two ways: on hand-built `Trace`s (the rule is a pure function of a recorded trace; the
refusal text in each OpCall is the one the real kernel gives on this machine, captured here,
never typed in), and end to end through `diagnose` against the plain PyTorch call failing.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.fix.strategies import worded
from dtype_doctor.records import ModelInfo, OpCall, TensorMeta, Trace, TraceFailure
from dtype_doctor.rules.dd100_kernel_rejected_operands import RULE, unexplained
from helpers_models import found


def refusal(call) -> str:
    """PyTorch's own first line for `call`, which must raise."""
    with pytest.raises((RuntimeError, TypeError, NotImplementedError)) as info:
        call()
    return str(info.value).splitlines()[0]


def scatter_add_refusal() -> str:
    return refusal(lambda: torch.zeros(4, dtype=torch.float16).scatter_add(0, torch.tensor([0, 1]), torch.ones(2)))


def meta(dtype: str, role: str = "input", shape=(4,), device: str = "cpu", name: str | None = None) -> TensorMeta:
    return TensorMeta(dtype=dtype, device=device, shape=shape, role=role, name=name)


def scatter_op(index: int = 0, *, module: str = "head", phase: str = "forward", error: str | None = None) -> OpCall:
    return OpCall(
        index=index,
        op="aten.scatter_add.default",
        module=module,
        module_type="Head",
        operands=(meta("float16"), meta("int64", "index", (2,)), meta("float32", shape=(2,))),
        phase=phase,
        error=error if error is not None else scatter_add_refusal(),
        recovered=True,
    )


def trace_of(*ops: OpCall, failure: TraceFailure | None = None) -> Trace:
    return Trace(ops=ops, modules=(), model=ModelInfo(class_name="M", state=()), inputs=(), failure=failure)


def test_the_rules_own_example_fails_in_plain_pytorch() -> None:
    message = scatter_add_refusal()
    assert "dtype" in message.lower()


def test_a_refusal_no_other_rule_explains_is_reported_with_pytorchs_words() -> None:
    op = scatter_op()
    assert unexplained(op)
    [f] = worded(RULE.check(trace_of(op)))
    assert (f.code, f.severity, f.module, f.op) == ("DD100", "error", "head", "aten.scatter_add.default")
    assert f.pytorch_error == op.error
    # The odd operand (the float32 source among float16) is named, and its fix casts it to
    # the others' dtype.
    assert {t.dtype for t in f.tensors} == {"float16", "int64", "float32"}
    assert [(s.strategy, s.applicability) for s in f.fixes] == [("cast-inputs", "safe")]
    assert "float16" in f.fixes[0].description


def test_one_finding_per_module_op_and_operand_dtypes() -> None:
    report = list(RULE.check(trace_of(scatter_op(0), scatter_op(1), scatter_op(2, module="other"))))
    assert [f.module for f in report] == ["head", "other"]


def test_a_backward_refusal_after_a_repaired_forward_is_not_reported() -> None:
    """The recorder repaired the forward below autograd; the backward meeting the original
    operands again is a consequence PyTorch would never reach."""
    findings = list(RULE.check(trace_of(scatter_op(0), scatter_op(1, module="b", phase="backward"))))
    assert [f.module for f in findings] == ["head"]
    # A backward refusal on its own (the forward ran) is reported.
    [alone] = RULE.check(trace_of(scatter_op(0, module="b", phase="backward")))
    assert alone.module == "b"


def test_an_error_that_is_not_about_dtypes_or_devices_is_not_dd100() -> None:
    message = refusal(lambda: torch.zeros(2, 3) @ torch.zeros(4, 5))  # a shape error
    operands = (meta("float32", shape=(2, 3)), meta("float32", shape=(4, 5)))
    op = OpCall(index=0, op="aten.mm.default", module="m", module_type="M", operands=operands, error=message)
    assert not unexplained(op)
    assert list(RULE.check(trace_of(op))) == []


def test_a_failure_outside_any_recorded_op_is_reported_once() -> None:
    failure = TraceFailure(kind="dtype", message="expected scalar type Float but found Half", module="enc", module_type="Enc", op=None)
    [f] = worded(RULE.check(trace_of(failure=failure)))
    assert (f.module, f.pytorch_error) == ("enc", failure.message)
    # The same refusal already recorded at an op is not reported twice.
    recorded = scatter_op(error=failure.message)
    assert [f.module for f in RULE.check(trace_of(recorded, failure=failure))] == ["head"]


def test_a_number_beyond_an_integer_dtype_is_refused_and_named() -> None:
    message = refusal(lambda: torch.zeros(3, dtype=torch.int8).fill_(1000))
    op = OpCall(index=0, op="aten.fill_.Scalar", module="m", module_type="M", operands=(meta("int8", shape=(3,)),), error=message)
    [f] = worded(RULE.check(trace_of(op)))
    assert "int8" in f.message and f.fixes[0].applicability == "display-only"


class ScatterHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(6, dtype=torch.float16)
        return out.scatter_add(0, index, self.proj(x).flatten())  # float32 source into float16


def test_end_to_end_against_plain_pytorch() -> None:
    model, x, index = ScatterHead(), torch.randn(3, 4), torch.tensor([0, 1, 2, 3, 4, 5])
    with pytest.raises(RuntimeError):
        model(x, index)
    [f] = found(dtype_doctor.diagnose(model, {"x": x, "index": index}), "DD100")
    assert (f.module, f.op, f.severity) == ("", "aten.scatter_add.default", "error")
    assert f.pytorch_error


def test_end_to_end_clean_when_the_dtypes_agree() -> None:
    class Agreeing(ScatterHead):
        def forward(self, x, index):
            return torch.zeros(6).scatter_add(0, index, self.proj(x).flatten())

    model, x, index = Agreeing(), torch.randn(3, 4), torch.tensor([0, 1, 2, 3, 4, 5])
    model(x, index)
    assert dtype_doctor.diagnose(model, {"x": x, "index": index}).findings == ()


def test_the_fix_names_the_dtype_the_source_must_take_not_the_index_dtype() -> None:
    model, x, index = ScatterHead(), torch.randn(3, 4), torch.tensor([0, 1, 2, 3, 4, 5])
    [f] = found(dtype_doctor.diagnose(model, {"x": x, "index": index}), "DD100")
    assert [s.strategy for s in f.fixes] == ["cast-inputs"]
    assert "float16" in f.fixes[0].description and "int64" not in f.fixes[0].description
    # The fix, applied by hand, is what PyTorch accepts.
    torch.zeros(6, dtype=torch.float16).scatter_add(0, index, model.proj(x).flatten().to(torch.float16))
