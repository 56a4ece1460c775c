"""The MPS oracle on op_db: DD120/DD121's verdicts against PyTorch's own MPS expectations.

No Mac is needed, and none is used: torch/testing/_internal/common_mps.py is what PyTorch's CI
expects of every op_db entry on MPS (expected failures by dtype and macOS version). For each
OpInfo and dtype it takes the first sample input, runs it on this CPU under a dispatch mode that
records each aten op with its operands (relabelled as on mps), and asks DD120 and DD121 of that
trace, as a simulated mps step would. Counted:

  expected fail   common_mps.py expects the op to fail on MPS for this dtype (unimplemented,
                  no float64/complex128, complex outside SUPPORTED_COMPLEX_OPS, macOS gates);
                  its numerical-mismatch lists (UNDEFINED, ON_MPS) are not failures and not counted
  agree           an error finding ⇔ an expected failure
  missed / false  the disagreements, each listed with --json

The figure says how far the aten-level rules (what a trace sees) reproduce the OpInfo-level
expectations: an op that decomposes, or whose aten name differs from its OpInfo name, can differ.

Usage: python benchmarks/oracle_mps.py [--macos 14.0] [--only NAME,…] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool", "complex64")


def _record(op, sample):
    """The aten ops one sample runs, as OpCalls with its operands on mps (None if the CPU call fails)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from dtype_doctor.records import OpCall, TensorMeta

    calls = []

    def metas(xs):
        return tuple(TensorMeta(dtype=str(t.dtype).removeprefix("torch."), device="mps:0", shape=tuple(t.shape))
                     for t in tree_flatten(xs)[0] if isinstance(t, torch.Tensor))

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            calls.append(OpCall(index=len(calls), op=f"aten.{func.__name__}", module="", module_type="",
                                operands=metas((args, kwargs)), outputs=metas(out)))
            return out

    try:
        with Record():
            op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - a CPU failure is not a case
        return None
    return tuple(calls)


def _expected(e, name: str, dtype: str, macos) -> bool:
    return e.refused(name, dtype, macos) is not None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--macos", default=None)
    p.add_argument("--only", default="")
    p.add_argument("--json", default="")
    a = p.parse_args()
    import warnings

    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from dtype_doctor.machine.mps_expectations import expectations, macos_version
    from dtype_doctor.records import ModelInfo, Trace
    from dtype_doctor.rules.dd120_float64_on_mps import RULE as DD120
    from dtype_doctor.rules.dd121_op_unimplemented_on_mps import RULE as DD121

    warnings.simplefilter("ignore")
    e, macos = expectations(), macos_version(a.macos)
    only = {n for n in a.only.split(",") if n}
    counts, disagreements = Counter(), []
    for info in op_db:
        name = info.name + info.variant_test_name
        if only and name not in only:
            continue
        cpu = {str(d).removeprefix("torch.") for d in info.supported_dtypes("cpu")}
        for dtype in (d for d in DTYPES if d in cpu):
            try:
                sample = next(iter(info.sample_inputs("cpu", getattr(torch, dtype), requires_grad=False)))
            except Exception:  # noqa: BLE001
                counts["no sample"] += 1
                continue
            ops = _record(info.op, sample)
            if not ops:
                counts["cpu fails"] += 1
                continue
            trace = Trace(ops=ops, modules=(), model=ModelInfo(class_name=name, state=()), inputs=(),
                          device="mps", simulated=True, macos=macos)
            predicted = any(f.severity == "error" for r in (DD120, DD121) for f in r.check(trace))
            expected = _expected(e, name, dtype, macos)
            counts["cases"] += 1
            counts["expected fail"] += expected
            counts["agree"] += predicted == expected
            if predicted != expected:
                counts["missed" if expected else "false"] += 1
                disagreements.append({"op": name, "dtype": dtype, "expected_fail": expected,
                                      "aten": sorted({o.op for o in ops})[:8]})
    n = counts["cases"] or 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    print(f"agreement {counts['agree']}/{counts['cases']} = {100 * counts['agree'] / n:.1f}% (macOS {macos[0]}.{macos[1]})")
    if a.json:
        Path(a.json).write_text(json.dumps({"counts": counts, "disagreements": disagreements}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
