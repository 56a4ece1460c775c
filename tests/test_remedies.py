"""Remedies: a rule says its fix as data, one definition says which dtype an operand must have,
and the fix strategies apply remedies by strategy name, whatever rule made them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from dtype_doctor.fix.engine import fix_model
from dtype_doctor.fix.strategies import STRATEGIES, Context, Pipeline
from dtype_doctor.ops.operands import anchor_dtype, required_dtype
from dtype_doctor.records import Remedy

from helpers_models import found


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


F64 = torch.float64
# case → (the op, an operand PyTorch rejects, its role, the dtype the op computes in, class target?)
CASES = {
    "embedding index": (lambda v: F.embedding(v, torch.randn(10, 4)), torch.tensor([1.0, 2.0]), "index", None, False),
    "nll_loss target": (lambda v: F.nll_loss(torch.randn(3, 5), v), torch.tensor([1, 0, 2], dtype=torch.int32), "target", "float32", True),
    "bce target": (lambda v: F.binary_cross_entropy_with_logits(torch.randn(3), v), torch.tensor([1, 0, 1]), "target", "float32", False),
    "linear input": (lambda v: F.linear(v, torch.randn(4, 4, dtype=F64)), torch.randn(2, 4), "input", "float64", False),
    "sdpa mask": (
        lambda v: F.scaled_dot_product_attention(*(torch.randn(1, 2, 3, 4, dtype=F64),) * 3, attn_mask=v),
        torch.ones(3, 3, dtype=torch.int64), "mask", "float64", False,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_required_dtype_is_what_pytorch_accepts(case: str) -> None:
    call, bad, role, anchor, class_target = CASES[case]
    with pytest.raises(RuntimeError):
        call(bad)  # PyTorch rejects the operand as it is ...
    wanted = required_dtype(role, _name(bad.dtype), anchor=anchor, class_target=class_target, query=anchor)
    call(bad.to(getattr(torch, wanted)))  # ... and accepts it in the dtype the doctor names


def test_anchor_prefers_the_weight_then_what_the_model_made() -> None:
    assert anchor_dtype([("float32", "input", True), ("float16", "weight", False)]) == "float16"
    assert anchor_dtype([("float32", "input", True), ("bfloat16", "other", False)]) == "bfloat16"
    assert anchor_dtype([("float32", "input", True), ("int64", "index", True)]) == "float32"
    assert anchor_dtype([("float32", "input", True)], inputs_too=False) is None


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.emb(input_ids)


def test_a_finding_carries_its_remedy_as_data_and_json() -> None:
    report = dtype_doctor.diagnose(Embed(), {"input_ids": torch.tensor([[1.0, 2.0]])})
    [f] = found(report, "DD103")
    [r] = f.remedies
    assert (r.strategy, r.target, r.to) == ("cast-inputs", "input_ids", "int64")
    assert f.to_dict()["remedies"] == [r.to_dict()]


def test_strategies_apply_remedies_by_strategy_name_not_rule_code() -> None:
    """A finding from a rule the strategies have never heard of is fixed by its remedy alone."""
    ids = torch.tensor([[1.0, 2.0]])
    report = dtype_doctor.diagnose(Embed(), {"input_ids": ids})
    [f] = found(report, "DD103")
    stranger = dataclasses.replace(report, findings=(dataclasses.replace(f, code="DD999"),))
    pipeline, step = STRATEGIES["cast-inputs"].run(Pipeline(Embed(), {"input_ids": ids}), stranger, Context())
    assert step.status == "applied" and pipeline.inputs["input_ids"].dtype == torch.int64
    # Without a remedy naming it, the strategy does not touch the finding.
    bare = dataclasses.replace(report, findings=(dataclasses.replace(f, remedies=()),))
    assert STRATEGIES["cast-inputs"].relevant(bare, Context()) == []


def test_a_tensor_made_in_model_code_is_named_by_the_remedy_not_cast() -> None:
    class Doubles(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.double())

    result = fix_model(Doubles(), {"x": torch.randn(2, 4)}, strategy="cast-inputs")
    [f] = found(result.before, "DD101")
    assert [r.target.split("@")[0] for r in f.remedies] == ["created:aten._to_copy.default"]
    assert f.remedies[0].stage == "model-code"
    [step] = result.steps
    assert step.status == "skipped" and "made in model code" in step.detail


def test_remedy_records_are_frozen() -> None:
    r = Remedy("autocast", "forward", "float16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.to = "bfloat16"  # type: ignore[misc]
