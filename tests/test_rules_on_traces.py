"""Rules are pure functions of a recorded Trace: judged here on hand-built ones, without a model.

Each rule's own test file checks it end to end on real models; this file checks the verdict
logic alone. Where an op is refused, the OpCall carries the refusal the real kernel gives on
this machine for those very dtypes (captured by running it), never a typed-in message; and the
same op with no refusal recorded must stay silent: rules explain refusals, they never invent one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dtype_doctor.records import LineageStep, ModelInfo, OpCall, StateTensor, TensorMeta, Trace
from dtype_doctor.fix.strategies import worded
from dtype_doctor.rules import get_rule


def refusal(call) -> str:
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)) as info:
        call()
    return str(info.value).splitlines()[0]


def meta(dtype: str, role: str, shape=(2, 4), *, name: str | None = None, device: str = "cpu", origin: str | None = None) -> TensorMeta:
    return TensorMeta(dtype=dtype, device=device, shape=shape, role=role, name=name, origin=origin)


def param(name: str, dtype: str, *, trainable: bool = True, shape=(4, 4), device: str = "cpu") -> StateTensor:
    return StateTensor(name=name, kind="parameter", dtype=dtype, device=device, shape=shape, requires_grad=trainable)


def trace_of(*ops: OpCall, params=(), inputs=(), lineage=None, train: bool = False) -> Trace:
    return Trace(
        ops=ops, modules=(), model=ModelInfo(class_name="M", state=tuple(params)), inputs=tuple(inputs),
        lineage=lineage or {}, train=train,
    )


def judged(code: str, trace: Trace) -> list:
    return list(worded(get_rule(code).check(trace)))


# ------------------------------------------------------------------ DD101


def linear_op(x_dtype: str, w_dtype: str, *, refused: bool = True) -> OpCall:
    error = None
    if refused:
        error = refusal(lambda: F.linear(torch.ones(2, 4, dtype=getattr(torch, x_dtype)), torch.ones(3, 4, dtype=getattr(torch, w_dtype))))
    return OpCall(
        index=0, op="aten.addmm.default", module="classifier", module_type="Linear",
        operands=(meta(x_dtype, "input", name="pixel_values", origin="input:pixel_values"), meta(w_dtype, "weight", (3, 4), name="classifier.weight")),
        error=error,
    )


def test_dd101_an_input_against_half_weights_is_cast_to_the_weights_dtype() -> None:
    lineage = {"pixel_values": (LineageStep("processor", "float32"), LineageStep("model-boundary", "float32"))}
    trace = trace_of(linear_op("float32", "float16"), params=[param("classifier.weight", "float16")],
                     inputs=[meta("float32", "input", name="pixel_values")], lineage=lineage)
    [f] = judged("DD101", trace)
    assert (f.module, f.severity, f.stage) == ("classifier", "error", "processor")
    assert any(r.strategy == "cast-inputs" and r.target == "pixel_values" and r.to == "float16" for r in f.remedies)


def test_dd101_is_silent_where_the_kernel_did_not_refuse() -> None:
    assert judged("DD101", trace_of(linear_op("float32", "float16", refused=False))) == []
    assert judged("DD101", trace_of(linear_op("float32", "float32", refused=False))) == []


# ------------------------------------------------------------------ DD102


def test_dd102_a_stray_fp32_block_in_a_half_model() -> None:
    params = [param("encoder.weight", "float16", shape=(64, 64)), param("pooler.weight", "float32")]
    [f] = judged("DD102", trace_of(params=params))
    assert (f.module, f.stage) == ("pooler", "model-loading")
    assert [r.strategy for r in f.remedies] == ["half-model"]


def test_dd102_fp32_trainables_on_a_frozen_half_base_are_the_recommended_setup() -> None:
    params = [param("base.weight", "float16", trainable=False, shape=(64, 64)), param("lora_A.weight", "float32")]
    assert judged("DD102", trace_of(params=params)) == []


# ------------------------------------------------------------------ DD103


def test_dd103_floating_indices_into_an_embedding() -> None:
    error = refusal(lambda: F.embedding(torch.tensor([[1.0, 2.0]]), torch.randn(10, 4)))
    op = OpCall(
        index=0, op="aten.embedding.default", module="embeddings.word_embeddings", module_type="Embedding",
        operands=(meta("float32", "weight", (10, 4)), meta("float32", "index", (1, 2), name="input_ids", origin="input:input_ids")),
        error=error,
    )
    [f] = judged("DD103", trace_of(op, inputs=[meta("float32", "input", (1, 2), name="input_ids")]))
    assert f.module == "embeddings.word_embeddings"
    assert any(r.target == "input_ids" and r.to == "int64" for r in f.remedies)


# ------------------------------------------------------------------ DD104


def nll(target_dtype: str) -> OpCall:
    call = lambda: F.nll_loss(torch.randn(2, 3).log_softmax(-1), torch.tensor([0, 2], dtype=getattr(torch, target_dtype)))  # noqa: E731
    try:
        call()
        error = None
    except RuntimeError as exc:
        error = str(exc).splitlines()[0]
    return OpCall(
        index=0, op="aten.nll_loss_forward.default", module="", module_type="",
        operands=(meta("float32", "input", (2, 3)), meta(target_dtype, "target", (2,), name="labels", origin="input:labels")),
        error=error,
    )


def test_dd104_int32_class_labels_are_refused_and_become_int64() -> None:
    op = nll("int32")
    assert op.error is not None  # PyTorch refuses them
    [f] = judged("DD104", trace_of(op, inputs=[meta("int32", "target", (2,), name="labels")]))
    assert f.severity == "error" and any(r.target == "labels" and r.to == "int64" for r in f.remedies)


def test_dd104_int64_class_labels_are_right() -> None:
    op = nll("int64")
    assert op.error is None
    assert judged("DD104", trace_of(op)) == []


# ------------------------------------------------------------------ DD201


def fake_cuda_refusal() -> str:
    """The refusal a simulated CUDA trace records for a CPU input against cuda:0 weights."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.ones(2, 4), torch.ones(3, 4, device="cuda")
        return refusal(lambda: F.linear(x, w))


def test_dd201_an_input_left_on_the_cpu_is_moved_to_the_models_device() -> None:
    op = OpCall(
        index=0, op="aten.addmm.default", module="classifier", module_type="Linear",
        operands=(meta("float32", "input", name="x", origin="input:x"), meta("float32", "weight", (3, 4), device="cuda:0")),
        error=fake_cuda_refusal(),
    )
    trace = trace_of(op, params=[param("classifier.weight", "float32", device="cuda:0")], inputs=[meta("float32", "input", name="x")])
    [f] = judged("DD201", trace)
    assert (f.module, f.stage) == ("classifier", "transfer")
    assert "cpu" in f.message and "cuda:0" in f.message
    assert [s.strategy for s in f.fixes] == ["to-device"]


def test_dd201_a_cpu_scalar_on_any_device_is_fine() -> None:
    op = OpCall(
        index=0, op="aten.mul.Tensor", module="", module_type="",
        operands=(meta("float32", "input", device="cuda:0"), meta("float32", "input", (), device="cpu")),
    )
    assert judged("DD201", trace_of(op, params=[param("w", "float32", device="cuda:0")])) == []
