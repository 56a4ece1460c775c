"""DD107 dtype-unsupported-on-device: a kernel with no implementation for an operand's dtype.

Hand-built `Trace`s carry the refusal the real kernel gives on this machine (captured here),
and the bfloat16-without-tensor-cores warning is judged from the target GPU's compute
capability alone; end to end, `diagnose` agrees with the plain PyTorch call.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from dtype_doctor.fix.strategies import worded
from dtype_doctor.records import ModelInfo, OpCall, TensorMeta, Trace
from dtype_doctor.rules.dd107_dtype_unsupported_on_device import RULE, refused_dtype
from helpers_models import found


def refusal(call) -> str:
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)) as info:
        call()
    return str(info.value).splitlines()[0]


def meta(dtype: str, shape=(2, 3), role: str = "input") -> TensorMeta:
    return TensorMeta(dtype=dtype, device="cpu", shape=shape, role=role)


def op_call(op: str, *operands: TensorMeta, index: int = 0, error: str | None = None, module: str = "act") -> OpCall:
    return OpCall(index=index, op=op, module=module, module_type="Act", operands=operands, error=error)


def trace_of(*ops: OpCall, device: str = "cpu", gpu: str | None = None, capability=None) -> Trace:
    return Trace(
        ops=ops, modules=(), model=ModelInfo(class_name="M", state=()), inputs=(), device=device,
        gpu=gpu, gpu_capability=capability, simulated=capability is not None,
    )


def test_integer_gelu_is_refused_and_named() -> None:
    message = refusal(lambda: F.gelu(torch.arange(6).view(2, 3)))  # the rule's own example
    op = op_call("aten.gelu.default", meta("int64"), error=message)
    assert refused_dtype(op) == "int64"
    [f] = worded(RULE.check(trace_of(op)))
    assert (f.code, f.severity, f.module, f.op) == ("DD107", "error", "act", "aten.gelu.default")
    assert "int64" in f.message and f.pytorch_error == message
    assert [s.strategy for s in f.fixes] == ["cast-inputs"]


def test_a_refusal_that_does_not_name_the_dtype_is_read_from_the_operands() -> None:
    message = refusal(lambda: torch.arange(4).mean())  # "could not infer output dtype"
    [f] = worded(RULE.check(trace_of(op_call("aten.mean.default", meta("int64", (4,)), error=message))))
    assert [t.dtype for t in f.tensors] == ["int64"]


def test_a_mismatch_between_two_dtypes_is_not_dd107() -> None:
    message = refusal(lambda: torch.zeros(2, 3) @ torch.zeros(3, 2, dtype=torch.float16))
    op = op_call("aten.mm.default", meta("float32"), meta("float16", (3, 2)), error=message)
    assert refused_dtype(op) is None
    assert list(RULE.check(trace_of(op))) == []


def test_one_finding_per_module_op_and_dtype() -> None:
    message = refusal(lambda: F.gelu(torch.arange(6)))
    ops = [op_call("aten.gelu.default", meta("int64"), index=i, error=message) for i in range(3)]
    assert len(list(RULE.check(trace_of(*ops)))) == 1


def bf16_matmul(index: int = 0) -> OpCall:
    return op_call("aten.mm.default", meta("bfloat16"), meta("bfloat16", (3, 2)), index=index, module="proj")


@pytest.mark.parametrize(
    ("gpu", "capability", "warned"),
    [("t4 (compute capability 7.5)", (7, 5), True), ("v100 (compute capability 7.0)", (7, 0), True),
     ("a100 (compute capability 8.0)", (8, 0), False), ("h100 (compute capability 9.0)", (9, 0), False)],
)
def test_bfloat16_matmul_before_ampere_is_a_warning(gpu: str, capability, warned: bool) -> None:
    findings = list(RULE.check(trace_of(bf16_matmul(0), bf16_matmul(1), device="cuda:0", gpu=gpu, capability=capability)))
    if not warned:
        assert findings == []
        return
    [f] = findings
    assert (f.severity, f.module, f.stage) == ("warning", "proj", "model-loading")
    assert "2 bfloat16 matmul ops" in f.message and gpu in f.message
    assert {r.strategy for r in f.remedies} == {"autocast", "half-model"}
    assert all(r.to == "float16" for r in f.remedies)


def test_a_cpu_trace_has_no_gpu_generation_to_warn_about() -> None:
    assert list(RULE.check(trace_of(bf16_matmul()))) == []


class IntegerActivation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        counts = input_ids.sum(-1, keepdim=True)  # int64
        return self.emb(input_ids).mean(1) * F.gelu(counts)


def test_end_to_end_against_plain_pytorch() -> None:
    model, ids = IntegerActivation(), torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises((RuntimeError, NotImplementedError)):
        model(ids)
    [f] = found(dtype_doctor.diagnose(model, {"input_ids": ids}), "DD107")
    assert (f.op, f.severity) == ("aten.gelu.default", "error")
    assert [t.dtype for t in f.tensors] == ["int64"]


def test_end_to_end_clean_once_the_activation_is_floating() -> None:
    class Fixed(IntegerActivation):
        def forward(self, input_ids):
            return self.emb(input_ids).mean(1) * F.gelu(input_ids.sum(-1, keepdim=True).float())

    model, ids = Fixed(), torch.tensor([[1, 2, 3], [4, 5, 6]])
    model(ids)
    assert dtype_doctor.diagnose(model, {"input_ids": ids}).findings == ()
