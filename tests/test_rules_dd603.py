"""DD603 fsdp-low-precision-reduce: the dtype FSDP2's reduce-scatter really gets, recorded as an op."""

import dtype_doctor
from helpers_fsdp import build


def _reduce_dtypes(report):
    return {op.operands[0].dtype for op in report.trace.ops if "reduce_scatter" in op.op}


def test_reduce_dtype_unset_reduces_gradients_in_param_dtype():
    with dtype_doctor.fake_world(8) as mesh:
        model, x = build("bf16-reduce", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert _reduce_dtypes(report) == {"bfloat16"}
    [f] = [f for f in report.findings if f.code == "DD603"]
    assert "8 ranks" in f.message


def test_fp32_reduce_dtype_is_clean():
    with dtype_doctor.fake_world(8) as mesh:
        model, x = build("correct-policy", mesh)
        report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert _reduce_dtypes(report) == {"float32"} and "DD603" not in {f.code for f in report.findings}
