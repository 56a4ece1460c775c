"""A forward that raises never gets a clean report: the rule that explains the refusal reports it,
and when none does, DD001's net does. Found by the oracle sweep: fractional_max_pool on an
integer input fails in a factory op (`rand(dtype=int32)`), whose dtype is no tensor operand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dtype_doctor
import dtype_doctor.rules as rules


class FractionalPool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.fractional_max_pool2d(x, 2, output_size=(2, 2))


def _int_batch() -> dict[str, torch.Tensor]:
    return {"x": torch.randint(0, 5, (1, 1, 5, 5), dtype=torch.int32)}


def test_plain_pytorch_refuses_an_integer_fractional_pool() -> None:
    with pytest.raises(NotImplementedError, match="Int"):
        FractionalPool()(**_int_batch())


def test_a_factory_ops_refused_dtype_is_dd107() -> None:
    report = dtype_doctor.diagnose(FractionalPool(), _int_batch())
    errors = [f for f in report.findings if f.severity == "error"]
    assert [f.code for f in errors] == ["DD107"]
    assert "int32" in errors[0].message and errors[0].pytorch_error


def test_a_refusal_no_rule_explains_is_still_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue = rules.all_rules()
    # Take away the rules that explain this refusal: the net must still report the failure.
    monkeypatch.setattr(rules, "all_rules", lambda: tuple(r for r in catalogue if r.code not in ("DD100", "DD107")))
    report = dtype_doctor.diagnose(FractionalPool(), _int_batch())
    assert [(f.code, f.severity) for f in report.findings] == [("DD001", "error")]
    assert "no rule explains it" in report.findings[0].message


def test_the_net_keeps_to_the_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue = rules.all_rules()
    monkeypatch.setattr(rules, "all_rules", lambda: tuple(r for r in catalogue if r.code not in ("DD100", "DD107")))
    report = dtype_doctor.diagnose(FractionalPool(), _int_batch(), select="DD3")
    assert report.findings == ()
