"""The one analysis of the user's source: the line the lineage names for each output of a
preprocess function is the line where its dtype is made, the line the patches edit first."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dtype_doctor.fix.codemods import RetargetCast
from dtype_doctor.source.analysis import FunctionSource

PREP = '''
import numpy as np
import torch


def numpy_nan(example):
    ids = np.full(8, np.nan)
    ids[:3] = 5
    ids = np.nan_to_num(ids)
    return {"input_ids": ids, "attention_mask": np.ones(8, dtype=np.int64)}


def astype(example):
    ids = np.zeros(8)
    ids = ids.astype(np.float32)
    return {"input_ids": ids}


def tensor_dtype(example):
    out = {"attention_mask": torch.ones(8, dtype=torch.long)}
    out["input_ids"] = torch.tensor([3, 4, 5], dtype=torch.float32)
    return out


def no_cast(example):
    ids = [float(2 + i) for i in range(8)]
    return dict(input_ids=ids)


def inline_return(example):
    out = {"label": example["label"]}
    out["input_ids"] = np.nan_to_num(np.full(8, np.nan)) + 3
    if example["label"] == 0: return out
    return out


def appended(batch):
    out = {"pixel_values": []}
    for image in batch["image"]:
        pixels = np.asarray(image, dtype=np.float32)
        out["pixel_values"].append(torch.from_numpy(pixels).half())
    return out


def tokenize(examples, tokenizer):
    enc = tokenizer(examples["text"], truncation=True)
    return enc
'''


@pytest.fixture(scope="module")
def prep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "prep.py"
    path.write_text(textwrap.dedent(PREP).lstrip())
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("function", "key", "dtype", "needle"),
    [
        ("numpy_nan", "input_ids", "float64", "ids = np.full(8, np.nan)"),  # where float is made, not the return
        ("numpy_nan", "attention_mask", "int64", "np.ones(8, dtype=np.int64)"),
        ("astype", "input_ids", "float32", ".astype(np.float32)"),
        ("tensor_dtype", "input_ids", "float32", 'out["input_ids"] = torch.tensor'),
        ("no_cast", "input_ids", "float64", "ids = [float(2 + i)"),
        ("inline_return", "input_ids", "float64", 'out["input_ids"] = np.nan_to_num'),
        ("appended", "pixel_values", "float16", '.append(torch.from_numpy(pixels).half())'),
        ("tokenize", "input_ids", "int32", "return enc"),  # made inside the tokenizer: where it leaves the function
    ],
)
def test_the_line_that_makes_each_output_s_dtype(prep: Path, function: str, key: str, dtype: str, needle: str) -> None:
    assert FunctionSource(prep, function).dtype_line(key, dtype) == line_of(prep, needle)


def test_an_unreadable_or_missing_function_has_no_line(prep: Path, tmp_path: Path) -> None:
    assert FunctionSource(prep, "absent").dtype_line("input_ids") is None
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    assert FunctionSource(bad, "f").dtype_line("x") is None


def test_the_first_patch_attempt_edits_the_line_the_lineage_names(prep: Path) -> None:
    line = FunctionSource(prep, "astype").dtype_line("input_ids", "float32")
    r = RetargetCast("astype", "int64", key="input_ids", lines=[line]).apply(prep.read_text(), "prep.py")
    assert r.applied and f"line {line}:" in r.detail and "np.int64" in r.new_source
