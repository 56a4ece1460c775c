"""Asserting PyTorch's errors without depending on which CPU backend raised them.

The same mixed-dtype `F.conv2d` says `Input type (torch.HalfTensor) and weight type
(torch.FloatTensor) should be the same` on a CPU whose oneDNN has fp16 kernels and `expected
scalar type Half but found Float` on one whose oneDNN has none. Tests assert the error class
and the dtypes the message names, in any of the spellings PyTorch uses, never one backend's
sentence.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

import pytest

# Every way a PyTorch message spells a dtype: ScalarType names, legacy tensor type names,
# C++ type names and the Python names.
SPELLINGS: dict[str, str] = {
    "float16": r"\bHalf|c10::Half|float16|\bFP16\b|\bfp16\b",
    "bfloat16": r"BFloat16|bfloat16",
    "float32": r"(?<!B)Float(?!8)|\bfloat\b|float32",
    "float64": r"Double|\bdouble\b|float64",
    "int64": r"\bLong|\blong\b|int64",
    "int32": r"\bInt\b|IntTensor|\bint\b|int32",
    "uint8": r"\bByte|unsigned char|uint8",
    "bool": r"\bBool\b|\bbool\b",
}


def names_dtypes(message: str, *dtypes: str) -> bool:
    """Whether `message` names every one of `dtypes` (torch names: "float16", "int32", ...)."""
    return all(re.search(SPELLINGS[d], message) for d in dtypes)


@contextmanager
def raises_dtype_error(*dtypes: str, error: type[BaseException] = RuntimeError) -> Iterator[pytest.ExceptionInfo]:
    """`pytest.raises(error)` that also checks the message names each of `dtypes`."""
    with pytest.raises(error) as info:
        yield info
    message = str(info.value)
    assert names_dtypes(message, *dtypes), f"{message!r} does not name {dtypes}"


def last_error(stderr: str) -> tuple[str, str]:
    """(exception class, message) of the traceback that ends `stderr`."""
    for line in reversed(stderr.strip().splitlines()):
        m = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$", line)
        if m:
            return m.group(1).rsplit(".", 1)[-1], m.group(2)
    return "", ""
