"""diagnose() leaves the model as it was, whatever the forward did to it (trace/guard.py).

Each model here changes itself in its forward the way real models and user code do; the
snapshot (helpers_models.snapshot) is compared bitwise before and after, with object identity
for parameters and for the buffers and attributes a forward replaces.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import transformers

import dtype_doctor
from helpers_models import assert_same, snapshot


class WritesItsWeight(nn.Module):
    def __init__(self, then_raise: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.then_raise = then_raise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data.mul_(2)  # .data: a write autograd and the version counter never see
        with torch.no_grad():
            self.lin.bias.copy_(torch.full_like(self.lin.bias, 7.0))
        if self.then_raise:
            raise RuntimeError("the forward failed after writing its weights")
        return self.lin(x)


@pytest.mark.parametrize("then_raise", [False, True])
def test_weights_written_in_place_are_put_back(then_raise: bool) -> None:
    model, x = WritesItsWeight(then_raise), torch.randn(2, 4)
    before = snapshot(model)
    report = dtype_doctor.diagnose(model, {"x": x})
    assert_same(before, snapshot(model))
    assert (report.trace.failure is not None) == then_raise
    # Plain PyTorch keeps the write: this is what the guard undoes.
    probe = WritesItsWeight(False)
    w = probe.lin.weight.detach().clone()
    probe(x)
    assert torch.equal(probe.lin.weight, 2 * w)


class ReplacesItsState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0), persistent=False)
        self.cached = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.register_buffer("table", torch.arange(8.0), persistent=False)  # a longer cache, a new object
        self.cached = 8
        self.scratch = torch.zeros(1)  # an attribute that was not there
        self.lin.weight.requires_grad_(False)
        return self.lin(x) + self.table[:4]


def test_buffers_and_attributes_a_forward_replaces_are_put_back() -> None:
    model = ReplacesItsState()
    table, weight = model.table, model.lin.weight
    before = snapshot(model)
    dtype_doctor.diagnose(model, {"x": torch.randn(2, 4)}, train=True)
    assert_same(before, snapshot(model))
    assert model.table is table and model.cached == 4 and not hasattr(model, "scratch")
    assert model.lin.weight is weight and weight.requires_grad


def test_dynamic_rope_past_its_cached_length_is_put_back() -> None:
    config = transformers.AutoConfig.from_pretrained("fixtures/models/llama-tiny")
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    rope = model.model.rotary_emb
    ids = torch.randint(4, 600, (1, config.max_position_embeddings + 40))  # past the cached length
    inv_freq, attrs = rope.inv_freq, {k: v for k, v in vars(rope).items() if not isinstance(v, (torch.Tensor, dict))}
    before = snapshot(model)
    dtype_doctor.diagnose(model, {"input_ids": ids})
    assert_same(before, snapshot(model))
    assert rope.inv_freq is inv_freq
    assert {k: v for k, v in vars(rope).items() if not isinstance(v, (torch.Tensor, dict))} == attrs
    # Plain transformers re-registers the buffer: the thing put back.
    model(input_ids=ids)
    assert rope.inv_freq is not inv_freq


def test_only_the_weights_written_are_copied() -> None:
    from dtype_doctor.trace.guard import preserved

    from dtype_doctor.trace.guard import WriteGuard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with preserved(model, train=False):
        model[1].weight.data.zero_()
    assert model[1].weight.abs().sum() > 0
    # A forward that only reads copies nothing; a write copies the one weight written.

    guard = WriteGuard(list(model.parameters()))
    with guard:
        model(torch.randn(2, 4))
    assert guard.saved == {}
    with guard:
        model[0].bias.data.add_(1)
    assert len(guard.saved) == 1
