"""The full oracle sweep: dtype-doctor's verdicts against real PyTorch over its own op database.

For every OpInfo op (torch.testing's op_db) runnable on this CPU: valid float32 samples as
they are ("clean"), with one tensor argument cast to another dtype ("perturbed"), and the
op's own dtype error inputs; for every module of module_db, a float32 module given one
forward input in another dtype ("module"). Each case is called for real on this CPU (the oracle) and
traced by `diagnose()` in normal mode and with `simulate=True` (fake tensors, CUDA target).

  normal   real error ⇔ an error-level finding; "dropped" = real error, no error finding
  simulated agreement with the real CPU outcome, except where the CPU↔CUDA table says
           the CUDA kernel differs (then the CUDA verdict is the expected one)

Usage: python benchmarks/oracle_sweep.py [--samples 2] [--only NAME,…] [--limit N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_LOGS", "-all")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument("--only", default="", help="comma-separated OpInfo names")
    p.add_argument("--limit", type=int, default=0, help="stop after N cases")
    p.add_argument("--no-simulate", action="store_true", help="normal mode only")
    p.add_argument("--json", default="", help="write every disagreement there")
    p.add_argument("--kinds", default="perturbed,clean,error-input,module", help="case kinds (module: module_db)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    import opdb_cases as oc

    only = set(filter(None, a.only.split(",")))
    stats: dict[tuple[str, str], Counter] = defaultdict(Counter)
    bad: list[dict] = []
    start = time.perf_counter()
    n = 0
    for case in oc.cases(samples_per_op=a.samples, kinds=tuple(a.kinds.split(","))):
        if only and case.op.split(".")[0] not in only and case.op not in only:
            continue
        n += 1
        if a.limit and n > a.limit:
            break
        key = (case.family, case.kind)
        c = stats[key]
        c["cases"] += 1
        real = oc.real_error(case)
        c["real errors"] += real is not None
        try:
            normal = oc.errors_in(oc.doctor_report(case))
        except Exception as exc:  # noqa: BLE001 - a crash of the tool is a disagreement too
            normal = None
            bad.append({"case": str(case), "mode": "normal", "crash": repr(exc)[:300]})
        if normal is not None:
            if real is not None and not normal:
                c["dropped"] += 1
                bad.append({"case": str(case), "mode": "normal", "real": _msg(real), "doctor": []})
            elif real is None and normal:
                c["false alarms"] += 1
                bad.append({"case": str(case), "mode": "normal", "real": None, "doctor": _codes(normal)})
            elif real is not None and all(f.code == "DD001" for f in normal):
                c["as DD001"] += 1
        if a.no_simulate:
            continue
        expected = oc.expected_on_cuda(case, real)
        if (expected is None) != (real is None):
            c["CUDA differs (table)"] += 1
        try:
            report = oc.doctor_report(case, simulate=True, device="cuda")
        except Exception as exc:  # noqa: BLE001
            bad.append({"case": str(case), "mode": "simulated", "crash": repr(exc)[:300]})
            c["sim crashed"] += 1
            continue
        if any(f.code == "DD001" and f.severity == "warning" for f in report.findings):
            c["sim cannot follow"] += 1
            continue
        c["sim judged"] += 1
        sim_error = bool(oc.errors_in(report))
        if sim_error == (expected is not None):
            c["sim agree"] += 1
        else:
            bad.append({"case": str(case), "mode": "simulated", "real": _msg(real), "expected_cuda": expected is not None, "doctor": _codes(oc.errors_in(report))})
    took = time.perf_counter() - start
    _print(stats, took)
    if a.json:
        Path(a.json).write_text(json.dumps(bad, indent=1))
    total = sum(stats.values(), Counter())
    print("BENCH-RESULT " + json.dumps({"name": "oracle_sweep", **total, "seconds": round(took, 1)}))
    return 0


def _msg(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__


def _codes(findings: list) -> list[str]:
    return [f"{f.code} {f.message[:120]}" for f in findings]


def _print(stats: dict, took: float) -> None:
    cols = ["cases", "real errors", "dropped", "as DD001", "false alarms", "sim judged", "sim agree", "CUDA differs (table)", "sim cannot follow"]
    print(f"{'family':<15}{'kind':<13}" + "".join(f"{c[:12]:>13}" for c in cols) + f"{'sim %':>8}")
    total: Counter = Counter()
    for (fam, kind), c in sorted(stats.items()):
        total.update(c)
        print(f"{fam:<15}{kind:<13}" + "".join(f"{c[k]:>13}" for k in cols) + f"{_pct(c):>8}")
    print(f"{'all':<28}" + "".join(f"{total[k]:>13}" for k in cols) + f"{_pct(total):>8}")
    print(f"{took:.0f} s")


def _pct(c: Counter) -> str:
    return f"{100 * c['sim agree'] / c['sim judged']:.1f}" if c["sim judged"] else "-"


if __name__ == "__main__":
    raise SystemExit(main())
