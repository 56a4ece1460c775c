"""DD120 float64-on-mps and DD121 op-unimplemented-on-mps, judged from the installed torch's own
MPS expectations (torch/testing/_internal/common_mps.py) and the MPS sources' float64 refusal.

No Mac here: each test first shows, in the installed torch's files, the expectation the rule
mirrors, then that the rule says it of a trace whose tensors are on mps, and nothing elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dtype_doctor.machine import mps_expectations as mps
from dtype_doctor.records import ModelInfo, OpCall, TensorMeta, Trace
from dtype_doctor.rules.dd120_float64_on_mps import RULE as DD120
from dtype_doctor.rules.dd121_op_unimplemented_on_mps import RULE as DD121

TESTING = Path(torch.__file__).parent / "testing" / "_internal"


def meta(dtype: str, device: str = "mps", name: str | None = "x") -> TensorMeta:
    return TensorMeta(dtype=dtype, device=device, shape=(3, 3), name=name, origin=f"input:{name}")


def trace_of(*ops: OpCall, macos=None) -> Trace:
    return Trace(ops=ops, modules=(), model=ModelInfo(class_name="M", state=()), inputs=(),
                 device="mps", simulated=True, macos=macos)


def op(name: str, *operands: TensorMeta) -> OpCall:
    return OpCall(index=0, op=name, module="body", module_type="Body", operands=operands)


def test_float64_refusal_is_the_one_torch_documents():
    # common_methods_invocations.py quotes the MPS refusal DD120 mirrors, and common_mps.py
    # expects every op of op_db to fail on torch.double.
    quoted = (TESTING / "common_methods_invocations.py").read_text()
    assert "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64" in quoted
    assert mps.FLOAT64_ERROR.startswith("Cannot convert a MPS Tensor to float64 dtype")
    source = (TESTING / "common_mps.py").read_text()
    assert "torch.double,\n                        torch.cdouble," in source


def test_dd120_float64_on_mps_is_an_error_with_a_float32_cast():
    found = list(DD120.check(trace_of(op("aten.mm.default", meta("float64"), meta("float32", name="w")))))
    assert [f.code for f in found] == ["DD120"] and found[0].severity == "error"
    assert [(r.strategy, r.target, r.to) for r in found[0].remedies] == [("cast-inputs", "x", "float32")]
    assert DD120.rejects(op("aten.mm.default", meta("float64")))


def test_dd120_silent_off_mps_and_for_float32():
    assert not list(DD120.check(trace_of(op("aten.mm.default", meta("float64", device="cpu")))))
    assert not list(DD120.check(trace_of(op("aten.mm.default", meta("float32"), meta("float16")))))


def test_common_mps_tables_parsed_from_the_installed_torch():
    e = mps.expectations()
    source = (TESTING / "common_mps.py").read_text()
    assert '"linalg.eig": None' in source and e.unimplemented["linalg.eig"] is None
    assert len(e.unimplemented) > 20 and "add" in e.complex_ok


def test_dd121_unimplemented_op_on_mps():
    found = list(DD121.check(trace_of(op("aten.linalg_eig.default", meta("float32")))))
    assert [f.code for f in found] == ["DD121"]
    assert not list(DD121.check(trace_of(op("aten.mm.default", meta("float32")))))
    assert not list(DD121.check(trace_of(op("aten.linalg_eig.default", meta("float32", device="cpu")))))


def test_macos_gate_from_a_before_list():
    src = 'def f():\n    MACOS_BEFORE_14_4_XFAILLIST = {"fft.hfft2": [torch.complex64]}\n    SUPPORTED_COMPLEX_OPS = {"fft.hfft2"}\n'
    e = mps.parse(src)
    assert e.refused("fft.hfft2", "complex64", (14, 2)) is not None
    assert e.refused("fft.hfft2", "complex64", (14, 4)) is None
    assert e.refused("fft.hfft2", "bfloat16", (13, 0)) is not None  # bf16 needs macOS 14


def test_macos_version_defaults_to_the_oldest_supported():
    assert mps.macos_version(None) == mps.expectations().min_macos
    assert mps.macos_version("15.1") == (15, 1)
    for bad in ("13.5", "sonoma", ""):
        with pytest.raises(ValueError):
            mps.macos_version(bad)


def test_dd121_judges_the_ops_data_not_its_int64_indices():
    # pytorch/examples mnist/main.py trains on a Mac: max_pool2d's backward takes the int64 indices the forward
    # made for a float32 pool (shown here), and common_mps.py's int64 entry for it is the pooled input's dtype
    # (its OpInfo's dtypesIfMPS lists the input dtypes, int64 among them).
    _, indices = torch.nn.functional.max_pool2d(torch.randn(1, 1, 4, 4), 2, return_indices=True)
    assert indices.dtype == torch.int64
    assert "int64" in (mps.expectations().unimplemented["max_pool2d_with_indices_backward"] or ())
    backward = "aten.max_pool2d_with_indices_backward.default"
    grad, pooled = meta("float32", name="g"), meta("float32", name="p")
    index = TensorMeta(dtype="int64", device="mps", shape=(1, 1, 2, 2), role="index")
    assert not list(DD121.check(trace_of(op(backward, grad, pooled, index))))
    found = list(DD121.check(trace_of(op(backward, meta("int64", name="g"), meta("int64", name="p"), index))))
    assert [f.code for f in found] == ["DD121"] and "int64" in found[0].message


def test_dd120_a_float64_copy_onto_mps_is_said_as_a_copy_with_its_fix_in_words():
    # pytorch/examples mnist's evaluation loop, `data.to(device)` of a float64 batch: the copy is what a Mac
    # refuses (FLOAT64_ERROR above), so no cast "where the tensor is made in the model" is offered.
    copy = OpCall(index=0, op="aten._to_copy.default", module="", module_type="Net",
                  operands=(TensorMeta(dtype="float64", device="cpu", shape=(8, 4)),),
                  outputs=(TensorMeta(dtype="float64", device="mps", shape=(8, 4), origin="created:aten._to_copy.default@"),))
    (found,) = DD120.check(trace_of(copy))
    assert "copied to mps" in found.message and found.stage == "transfer" and found.module_type is None
    assert found.remedies == () and any("before its copy to mps" in str(h) for h in found.hints)
