"""What a kernel's refusal says: is it about dtypes, devices, or neither; which dtype it lacks.

Pure functions of PyTorch's message and the recorded operands (no torch import), shared by
the recorder (which repairs dtype and device refusals) and the rules (which explain them).
"""

from __future__ import annotations

import re

from dtype_doctor.records import TensorMeta

# PyTorch's wording for tensors on different devices. Not any "device" or "cuda": "CUDA out of
# memory", "only supported on CUDA" and "device-side assert" are not about where operands are.
_DEVICE_ERROR = re.compile(
    r"same device|different devices?|expected device|device type|on device|on the \w* ?device|to have device"
    r"|device propagation|devices?,? (?:cuda|cpu|meta|mps|xpu)|does not equal (?:cuda|cpu|meta)|not at the same device"
    r"|expected all tensors to be on",
    re.I,
)
# A dtype refusal names a dtype in PyTorch's spelling (Half, c10::BFloat16, LongTensor, torch.int32),
# which is case-sensitive: "padding should be at most half of kernel size" names none.
_DTYPE_NAMES = re.compile(
    r"\b(Half|Float|Double|BFloat16|Long|Int|Short|Char|Byte|Bool|ComplexFloat|ComplexDouble)(Tensor)?\b"
    r"|torch\.(float|bfloat|int|uint|bool|complex)\d*\b"
)
_DTYPE_ERROR = re.compile(
    r"dtype|scalar ?type|type \(|can't be cast|same type|not implemented for|\bbool\b|floating.point|integral"
    r"|complex tensor|should be type|converted to type"
    # CUDA autocast's refusal of an op it deems unsafe in half precision (binary_cross_entropy).
    r"|unsafe to autocast",
    re.I,
)
# PyTorch's C++ scalar type names → ours.
_SCALAR_NAMES = {
    "Half": "float16", "BFloat16": "bfloat16", "Float": "float32", "Double": "float64",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
    "ComplexFloat": "complex64", "ComplexDouble": "complex128",
}
# PyTorch's wording, and the CPU↔CUDA table's (trace/cuda_table.py).
_NOT_IMPLEMENTED = re.compile(r"not implemented for '(\w+)'|no CUDA kernel for (\w+)")
# Refusals of one dtype that do not name it.
_ONE_DTYPE = re.compile(
    r"could not infer output dtype|on a bool tensor|floating point or complex|only supports? floating"
    r"|must be (either )?a floating|not supported for (integer|bool)|integral|Expected a floating",
    re.I,
)


# The op name under which an RNN's own input-vs-weight check (torch/nn/modules/rnn.py) is recorded.
RNN_INPUT_CHECK = "torch.nn.RNNBase.check_input"

# "value cannot be converted to type c10::Half without overflow": a number beyond a floating
# dtype's range (DD301's). An integer's ("… type int8_t without overflow") is a dtype refusal.
_OVERFLOW = re.compile(r"converted to type (?:c10::|at::)?(?:Half|BFloat16|float|double) without overflow")


def classify_error(message: str, operands: tuple[TensorMeta, ...]) -> str:
    """'dtype', 'device', 'overflow' (a number beyond a floating dtype's range) or 'other'."""
    if _OVERFLOW.search(message):
        return "overflow"
    devices = {t.device for t in operands if not t.is_scalar}
    if len(devices) > 1 and _DEVICE_ERROR.search(message):
        return "device"
    if _DTYPE_ERROR.search(message) or _DTYPE_NAMES.search(message):
        return "dtype"
    if _DEVICE_ERROR.search(message):
        return "device"
    # Some kernels (oneDNN's convolution_backward, for one) fail on mixed dtypes without
    # saying so; the operands say it.
    if len({t.dtype for t in operands if t.is_floating and not t.is_scalar}) > 1:
        return "dtype"
    return "other"


def data_operands(operands: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
    """The operands whose dtype the kernel computes in: not indices, masks, targets or scalars."""
    return tuple(t for t in operands if not t.is_scalar and t.role not in ("index", "mask", "target"))


def scalar_type_name(dtype: str) -> str:
    """Our dtype name as PyTorch's C++ messages spell it: "float16" → "Half"."""
    return next((k for k, v in _SCALAR_NAMES.items() if v == dtype), dtype)


def unsupported_dtype(message: str, operands: tuple[TensorMeta, ...]) -> str | None:
    """The dtype a kernel refused outright (no kernel for it), or None for a mismatch.

    "\"gelu\" not implemented for 'Long'" names it; other refusals of one dtype ("mean():
    could not infer output dtype … Got: Long", "Negation … on a bool tensor") are read from
    the operands when every data operand has that one dtype.
    """
    m = _NOT_IMPLEMENTED.search(message)
    if m:
        name = m.group(1) or m.group(2)
        return _SCALAR_NAMES.get(name, name)
    if not _ONE_DTYPE.search(message):
        return None
    dtypes = {t.dtype for t in data_operands(operands)}
    return dtypes.pop() if len(dtypes) == 1 else None
