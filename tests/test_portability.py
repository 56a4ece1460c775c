"""Tests must pass on any CPU: Intel or AMD, oneDNN with or without fp16 kernels.

PyTorch's wording for one mixed-dtype conv differs by backend; these tests pin the helper
that asserts errors by class and dtypes instead, and keep backend wording out of the suite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers_errors import last_error, names_dtypes, raises_dtype_error

TESTS = Path(__file__).resolve().parent

# The same F.conv2d(half input, float weight) on two machines (both seen on torch 2.13 CPU).
ONEDNN_FP16 = "Input type (torch.HalfTensor) and weight type (torch.FloatTensor) should be the same"
NO_ONEDNN_FP16 = "expected scalar type Half but found Float"


@pytest.mark.parametrize("message", [ONEDNN_FP16, NO_ONEDNN_FP16])
def test_both_backends_wordings_name_the_dtypes(message: str) -> None:
    assert names_dtypes(message, "float16", "float32")
    assert not names_dtypes(message, "int64")
    assert not names_dtypes("Found dtype BFloat16", "float32")  # BFloat16 is not Float


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float16, torch.float32), (torch.float32, torch.float16)])
def test_this_cpu_names_both_dtypes_of_a_mixed_conv(x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    x, w = torch.randn(1, 3, 8, 8, dtype=x_dtype), torch.randn(4, 3, 3, 3, dtype=w_dtype)
    with raises_dtype_error(str(x_dtype)[6:], str(w_dtype)[6:]):
        F.conv2d(x, w)


def test_the_helper_fails_on_a_message_without_the_dtypes() -> None:
    with pytest.raises(AssertionError):
        with raises_dtype_error("float16"):
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)")


def test_last_error_reads_the_end_of_a_traceback() -> None:
    stderr = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: expected scalar type Half but found Float\n"
    assert last_error(stderr) == ("RuntimeError", "expected scalar type Half but found Float")


# Phrases only one backend says; tests must not match on them.
BACKEND_WORDING = re.compile(r"""(match=|in\s+\w+\.stderr|startswith\().{0,4}["'][^"']*(Input type \\?\(|expected scalar type|MKLDNN|mkldnn)""")


def test_no_test_pins_one_backends_wording() -> None:
    offenders = [
        f"{p.name}:{i}"
        for p in sorted(TESTS.glob("test_*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if BACKEND_WORDING.search(line)
    ]
    assert offenders == []
