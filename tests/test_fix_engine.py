"""The fix loop's promises, on small real models: verify, refuse, roll back, never touch the
user's model, and measure parity and the autocast-vs-half trade-off."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from dtype_doctor.fix.engine import fix_model
from dtype_doctor.records import FP16_MAX

from helpers_models import assert_same, snapshot


class HalfConv(nn.Module):
    """fp16 weights, fed float32: the classic 'Input type (float) and weight type (Half)'."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3).half()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.conv(pixel_values).float().mean((2, 3))


class Loud(nn.Module):
    """fp32 model fed fp16 features whose fp32 activations exceed fp16's range."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(4, 4)
        with torch.no_grad():
            self.big.weight.fill_(40000.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.big(x)


def test_auto_picks_the_least_invasive_fix_and_leaves_the_model_alone() -> None:
    model, x = HalfConv(), torch.randn(2, 3, 8, 8)
    before = snapshot(model)
    result = fix_model(model, {"pixel_values": x})
    assert result.verified and result.detail.startswith("verified")
    assert [s.strategy for s in result.applied] == ["cast-inputs"]
    assert result.pipeline.inputs["pixel_values"].dtype == torch.float16
    # the fixed pipeline really runs, where the original raises
    result.pipeline.model(**result.pipeline.inputs)
    assert_same(before, snapshot(model))
    assert result.parity.reference == "float32" and result.parity.cosine > 0.999


def test_a_named_strategy_is_used_alone() -> None:
    result = fix_model(HalfConv(), {"pixel_values": torch.randn(2, 3, 8, 8)}, strategy="autocast")
    assert result.verified and [s.strategy for s in result.applied] == ["autocast"]
    assert result.pipeline.autocast == "float16"
    assert result.pipeline.inputs["pixel_values"].dtype == torch.float32  # autocast casts per op


def test_unsafe_strategies_need_consent() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(2, 4).half()  # fp16 features into an fp32 model: half-model would also fix it
    auto = fix_model(model, {"input": x}, strategy="auto")
    assert [s.strategy for s in auto.applied] == ["cast-inputs"]
    assert all(s.strategy != "half-model" or s.status == "skipped" for s in auto.steps)


def test_half_model_is_refused_when_fp32_activations_overflow_fp16() -> None:
    model, x = Loud(), torch.ones(2, 4).half()
    refused = fix_model(model, {"x": x}, strategy="half-model")
    [step] = refused.steps
    assert step.status == "skipped" and "65504" in step.detail and "big" in step.detail
    assert not refused.verified
    # the evidence is real: the fp32 forward exceeds fp16's range, and the half model overflows
    assert model(x.float()).abs().max().item() > FP16_MAX
    half = Loud().half()
    with torch.no_grad():
        half.big.weight.fill_(40000.0)
    assert torch.isinf(half(x)).any()
    # --force applies it anyway, and the re-run proves it wrong: the fp16 forward overflows (DD301)
    forced = fix_model(Loud(), {"x": x}, strategy="half-model", force=True)
    [step] = forced.steps
    assert step.status == "failed" and "rolled back" in step.detail and not forced.verified
    assert forced.tradeoff.half_model.max_activation.value > FP16_MAX


class Put(nn.Module):
    """index_put of float32 values into an fp16 buffer copy: autocast does not cast index_put."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(4, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.table.clone()
        t.index_put_((torch.tensor([0]),), x)
        return t


def test_a_fix_that_does_not_help_is_rolled_back() -> None:
    x = torch.ones(1)
    try:
        Put()(x)
        raise AssertionError("index_put accepted mixed dtypes")
    except RuntimeError as exc:
        assert "Index put requires the source and destination dtypes match" in str(exc)
    # DD101 does not offer autocast here: autocast does not cast index_put's operands.
    [step] = fix_model(Put(), {"x": x}, strategy="autocast").steps
    assert (step.strategy, step.status) == ("autocast", "skipped")
    # Autocast leaves float64 operands as they are: offered for the fp16 conv, it does not help.
    pixels = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(RuntimeError):
        HalfConv()(pixels)
    result = fix_model(HalfConv(), {"pixel_values": pixels}, strategy="autocast")
    [step] = result.steps
    assert step.strategy == "autocast" and step.status == "failed" and step.detail.startswith("rolled back: ")
    assert not result.verified and result.pipeline.autocast is None  # nothing kept
    # auto goes on to the strategy that does help
    auto = fix_model(Put(), {"x": x})
    assert auto.verified and [s.strategy for s in auto.applied] == ["cast-inputs"]


def test_nothing_applies_to_a_mismatch_made_in_model_code() -> None:
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.double())

    result = fix_model(Inner(), {"x": torch.randn(2, 4)})
    assert not result.verified and result.detail == "no strategy applies to the remaining findings"
    reasons = {s.strategy: s.detail for s in result.steps}
    # The rule's remedy names the tensor the model made; no input to cast, and no half model helps.
    assert "created:aten._to_copy" in reasons["cast-inputs"] and "half-model" not in reasons


def test_the_loop_stops_at_the_cap() -> None:
    result = fix_model(HalfConv(), {"pixel_values": torch.randn(2, 3, 8, 8)}, max_rounds=1)
    assert result.rounds == 1 and result.verified


def test_labels_and_ids_are_cast_to_int64() -> None:
    class Cls(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self.emb(input_ids).mean(1), labels)

    ids, labels = torch.tensor([[1.0, 2.0]]), torch.tensor([1], dtype=torch.int32)
    result = fix_model(Cls(), {"input_ids": ids, "labels": labels})
    assert result.verified
    assert result.pipeline.inputs["input_ids"].dtype == torch.int64
    assert result.pipeline.inputs["labels"].dtype == torch.int64
    # The fp32 reference takes the ids as the fix made them (float ids would stop it too).
    assert result.parity is not None and result.parity.error is None
    assert result.parity.max_abs_diff == 0.0 and result.parity.cosine == 1.0


def test_fp32_trainable_fixes_grad_scaler_with_fp16_weights() -> None:
    model = nn.Sequential(nn.Linear(4, 2)).half()
    x = torch.randn(3, 4)
    # the real failure this guards against
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(x).float().sum()
    scaler.scale(loss).backward()
    try:
        scaler.unscale_(opt)
        raise AssertionError("GradScaler accepted fp16 gradients")
    except ValueError as exc:
        assert "Attempting to unscale FP16 gradients" in str(exc)
    model.zero_grad(set_to_none=True)

    result = fix_model(model, {"input": x}, train=True, autocast="float16")
    assert {f.code for f in result.before.findings} >= {"DD401"}
    assert result.verified and [s.strategy for s in result.applied] == ["fp32-trainable"]
    fixed = result.pipeline.model
    assert all(p.dtype == torch.float32 for p in fixed.parameters())
    assert all(p.dtype == torch.float16 for p in model.parameters())  # the user's model untouched
    # and the fixed model passes the real GradScaler step
    opt, scaler = torch.optim.SGD(fixed.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = fixed(x).float().sum()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)


def test_tradeoff_measures_both_alternatives_on_the_model() -> None:
    result = fix_model(HalfConv(), {"pixel_values": torch.randn(2, 3, 8, 8)})
    t = result.tradeoff
    assert t.dtype == "float16"
    assert t.autocast.weight_bytes == t.reference_weight_bytes  # autocast keeps fp32 weights
    assert t.half_model.weight_bytes * 2 == t.reference_weight_bytes  # half halves them
    assert 0 <= t.half_model.max_abs_diff < 0.1 and t.autocast.cosine > 0.999
    assert t.to_dict()["half-model"]["weight_bytes"] == t.half_model.weight_bytes  # the JSON keeps its keys


def test_to_device_moves_a_batch_the_pipeline_forgot_to_move() -> None:
    """A CUDA model (simulated) fed a batch left on the CPU: DD201, fixed by to-device."""
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    before = snapshot(model)
    result = fix_model(model, {"input": x}, simulate=True, device="cuda", move_inputs=False)
    [f] = [f for f in result.before.findings if f.code == "DD201"]
    assert f.stage == "transfer" and "cpu" in f.message and "cuda:0" in f.message
    assert result.verified and [s.strategy for s in result.applied] == ["to-device"]
    assert [c.to for c in result.applied[0].changes] == ["cuda:0"]
    assert result.parity is None  # simulated: no values to compare
    assert_same(before, snapshot(model))
    # moved by the caller, the same batch is clean
    assert not fix_model(model, {"input": x}, simulate=True, device="cuda").before.findings


def test_one_trace_request_carries_the_options_and_the_placement_is_decided_once() -> None:
    """The request is settled before the first trace: a meta model (no data) is simulated on
    cuda:0, and every re-trace of the fix runs there as well."""
    from dtype_doctor.records import Subject
    from dtype_doctor.trace.request import TraceRequest
    from dtype_doctor.trace.engine import settle

    with torch.device("meta"):
        model = HalfConv()
    x = torch.randn(2, 3, 8, 8)
    request = TraceRequest(autocast="off", subject=Subject("half-conv", "pixels", "train"))
    assert request.autocast is None  # "off" as the CLI spells it
    settled = settle(model, {"pixel_values": x}, request)
    assert (settled.simulate, settled.placement.device) == (True, "cuda:0")

    result = fix_model(model, {"pixel_values": x}, request, strategy="cast-inputs")
    assert result.verified and result.pipeline.request.placement.device == "cuda:0" and result.pipeline.simulate
    assert (result.before.target.model, result.before.target.split) == ("half-conv", "train")
    assert result.after.target.simulated and result.after.target.device == "cuda:0"
    # The typed outcome is what the report carries; its JSON is SPEC's fix block.
    outcome = result.report().fix
    assert outcome.verified and outcome.to_dict()["applied"][0]["strategy"] == "cast-inputs"
    # Options go as a request or as keywords, never both.
    with pytest.raises(TypeError):
        fix_model(model, {"pixel_values": x}, request, simulate=True)
