"""DD111 label-dtype-selects-problem-type: float class labels send a classifier to BCE.

transformers decides config.problem_type from the first labels it sees; these tests show the
plain transformers call failing (with an error that never names a dtype), the doctor naming
the labels' dtype instead of a bare DD001, the fix, and the setups that are right.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dtype_doctor
from helpers_models import found, load_fixture, token_batch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def classifier():
    return load_fixture("bert-tiny")  # num_labels=3, problem_type None


def batch(labels: torch.Tensor) -> dict[str, torch.Tensor]:
    return {**token_batch(vocab=300, batch=len(labels)), "labels": labels}


def test_plain_transformers_fails_with_a_shape_error_and_remembers_the_choice(classifier) -> None:
    assert classifier.config.problem_type is None
    with pytest.raises(ValueError, match="Target size"):
        classifier(**batch(torch.tensor([0.0, 2.0], dtype=torch.float64)))
    # The choice sticks in the config: int64 labels now fail too, until it is reset.
    assert classifier.config.problem_type == "multi_label_classification"
    with pytest.raises((ValueError, RuntimeError)):
        classifier(**batch(torch.tensor([0, 2])))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.uint8, torch.bool])
def test_labels_that_are_not_int64_or_int32_are_found(classifier, dtype) -> None:
    labels = torch.tensor([0, 1]).to(dtype)
    report = dtype_doctor.diagnose(classifier, batch(labels))
    [f] = found(report, "DD111")
    assert f.severity == "error" and f.module_type == "BertForSequenceClassification"
    assert f.pytorch_error and "Target size" in f.pytorch_error
    assert [(r.strategy, r.target, r.to) for r in f.remedies] == [("cast-inputs", "labels", "int64")]
    assert not found(report, "DD001"), "the failure is DD111's, not an unexplained one"
    # diagnose() leaves the config as it found it, so the next step decides again.
    assert classifier.config.problem_type is None


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_class_index_dtypes_choose_cross_entropy(classifier, dtype) -> None:
    report = dtype_doctor.diagnose(classifier, batch(torch.tensor([0, 2], dtype=dtype)))
    assert not found(report, "DD111")
    assert classifier.config.problem_type is None


def test_the_fix_is_the_one_transformers_accepts(classifier) -> None:
    out = classifier(**batch(torch.tensor([0.0, 2.0]).long()))
    assert out.loss is not None and classifier.config.problem_type == "single_label_classification"


def test_multi_hot_float_labels_are_a_real_multi_label_task(classifier) -> None:
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    classifier(**batch(labels))  # BCE over one float per class: right
    classifier.config.problem_type = None
    assert not found(dtype_doctor.diagnose(classifier, batch(labels)), "DD111")


def test_a_problem_type_set_explicitly_is_not_the_labels_choice(classifier) -> None:
    classifier.config.problem_type = "multi_label_classification"
    report = dtype_doctor.diagnose(classifier, batch(torch.tensor([0.0, 2.0])))
    assert not found(report, "DD111") and found(report, "DD001")


def test_scan_on_a_csv_whose_label_column_fillna_made_float(tmp_path: Path) -> None:
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\nthe movie was fine,0\nawful plot,2\ngreat acting,1\nboring,\n")  # a blank → NaN → float64
    before = data.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "scan", str(REPO / "fixtures/models/bert-tiny"), str(data), "--format", "json"],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert [(f["code"], f["stage"]) for f in report["findings"]] == [("DD111", "dataset")]
    assert report["lineage"]["labels"][0]["dtype"] == "float64"
    assert data.read_bytes() == before


def test_fix_casts_the_labels_and_the_rerun_is_clean(tmp_path: Path) -> None:
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\nthe movie was fine,0.0\nawful plot,2.0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "fix", str(REPO / "fixtures/models/bert-tiny"), str(data), "--train", "--format", "json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    fix = json.loads(proc.stdout)["fix"]
    assert fix["verified"] is True and fix["after"]["summary"]["error"] == 0
    [applied] = fix["applied"]
    assert applied["strategy"] == "cast-inputs" and applied["status"] == "applied"
    assert [(c["target"], c["to"]) for c in applied["changes"]] == [("labels", "int64")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.csv"]  # fix without --write-patch writes nothing
