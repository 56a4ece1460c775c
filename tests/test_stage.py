"""A finding's stage is where the operand first became one its consumer rejects, on each
lineage path; later stages that only change the width are shown, not blamed."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from dtype_doctor.records import LineageStep as Step
from dtype_doctor.records import SourceLoc

from helpers_models import found

PREP = SourceLoc("prep.py", 9)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.emb(input_ids)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3).double()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.conv(pixel_values)


class Classify(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.lin(x), labels)


def _blamed(report, name):
    return [s["stage"] for s in report.to_dict()["lineage"][name] if s.get("blamed_by")]


def test_float_ids_made_in_preprocess_and_narrowed_by_the_formatter_are_preprocess_s():
    ids = torch.tensor([[1.0, 2.0]])
    lineage = {"input_ids": (
        Step("dataset", "int64"), Step("preprocess", "float64", source=PREP), Step("formatter", "float32"),
        Step("collator", "float32", "cpu", (1, 2)), Step("model-boundary", "float32", "cpu", (1, 2)),
    )}
    try:
        Embed()(ids)
        raise AssertionError("embedding accepted float indices")
    except RuntimeError:
        pass
    report = dtype_doctor.diagnose(Embed(), {"input_ids": ids}, lineage=lineage)
    [f] = found(report, "DD103")
    assert f.stage == "preprocess" and [r.stage for r in f.remedies] == ["preprocess"]
    assert _blamed(report, "input_ids") == ["preprocess"]  # the formatter's narrowing is not blamed


def test_float_ids_made_by_the_formatter_are_the_formatter_s():
    lineage = {"input_ids": (Step("dataset", "int64"), Step("formatter", "float32"), Step("collator", "float32"))}
    report = dtype_doctor.diagnose(Embed(), {"input_ids": torch.tensor([[1.0, 2.0]])}, lineage=lineage)
    assert [f.stage for f in found(report, "DD103")] == ["formatter"]


def test_pixels_the_processor_made_floating_are_the_processor_s_not_the_dataset_s():
    """uint8 images are what a dataset holds; the processor made them float32, the conv wants float64."""
    pixels = torch.rand(1, 3, 8, 8)
    lineage = {"pixel_values": (
        Step("dataset", "uint8"), Step("processor", "float32"), Step("formatter", "float32"), Step("collator", "float32"),
    )}
    report = dtype_doctor.diagnose(Conv(), {"pixel_values": pixels}, lineage=lineage)
    [f] = found(report, "DD101")
    assert f.stage == "processor" and _blamed(report, "pixel_values") == ["processor"]


def test_labels_narrowed_by_the_collator_are_the_collator_s():
    """int64 labels were fine until the collator made them int32: a width change that is rejected."""
    x, labels = torch.randn(2, 4), torch.tensor([0, 2], dtype=torch.int32)
    lineage = {"labels": (Step("dataset", "int64"), Step("formatter", "int64"), Step("collator", "int32"))}
    report = dtype_doctor.diagnose(Classify(), {"x": x, "labels": labels}, lineage=lineage)
    [f] = found(report, "DD104")
    assert f.stage == "collator" and _blamed(report, "labels") == ["collator"]


def test_float64_from_the_dataset_is_the_dataset_s():
    class Lin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.float())

    lineage = {"x": (Step("dataset", "float64"), Step("preprocess", "float64"), Step("collator", "float64"))}
    report = dtype_doctor.diagnose(Lin(), {"x": torch.randn(2, 4, dtype=torch.float64)}, lineage=lineage)
    [f] = found(report, "DD105")
    assert f.stage == "dataset" and _blamed(report, "x") == ["dataset"]


def test_without_a_lineage_the_caller_s_batch_is_blamed():
    report = dtype_doctor.diagnose(Embed(), {"input_ids": torch.tensor([[1.0, 2.0]])})
    assert [f.stage for f in found(report, "DD103")] == ["collator"]
