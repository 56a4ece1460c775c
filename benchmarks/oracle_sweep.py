"""The full oracle sweep: dtype-doctor's verdicts against real PyTorch over its own op database.

For every OpInfo op (torch.testing's op_db) runnable on this CPU: valid float32 samples as
they are ("clean"), with one tensor argument cast to another dtype ("perturbed"), and the
op's own dtype error inputs; for every module of module_db, a float32 module as sampled
("module-clean"), given one forward input in another dtype ("module"), and its forward
error inputs ("module-error-input"). Each case is called for real on this CPU (the oracle)
and traced by `diagnose()` in normal mode and with `simulate=True` (fake tensors, CUDA target).

  normal    real error ⇔ an error-level finding; "dropped" = real error, no error finding
  simulated agreement with the real CPU outcome turned into CUDA's by PyTorch's own
            declarations (tests/opdb_cases.expected_on_cuda: op_db's CUDA lists, kernel facts),
            over every case but the listed SIMULATION_LIMITS; a real error the simulation only
            reports as "fake tensors cannot follow" (DD001 warning) is a disagreement
  clean     warnings on clean samples that the real call runs, per mode (value rules DD3xx
            are left out: PyTorch does not raise on values, so it cannot judge them)

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
    p.add_argument("--kinds", default="perturbed,clean,error-input,module,module-clean,module-error-input", help="case kinds (module*: module_db)")
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
        clean = case.kind in oc.CLEAN and real is None
        try:
            report = oc.doctor_report(case)
            normal = oc.errors_in(report)
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
            elif real is not None and all(f.code == "DD001" for f in normal) and oc.about_dtypes(real):
                c["as DD001"] += 1
                bad.append({"case": str(case), "mode": "normal", "real": _msg(real), "doctor": _codes(normal), "as": "DD001"})
            if clean:
                c["clean samples"] += 1
                if oc.warnings_in(report):
                    c["clean warn"] += 1
                    bad.append({"case": str(case), "mode": "normal", "clean": True, "doctor": _codes(oc.warnings_in(report))})
        if a.no_simulate:
            continue
        expected = oc.expected_on_cuda(case, real)
        if (expected is None) != (real is None):
            c["CUDA differs"] += 1
        limit = oc.simulation_limit(case, real)
        try:
            report = oc.doctor_report(case, simulate=True, device="cuda")
        except Exception as exc:  # noqa: BLE001
            bad.append({"case": str(case), "mode": "simulated", "crash": repr(exc)[:300]})
            c["sim crashed"] += 1
            continue
        follow = any(oc.cannot_follow(f) for f in report.findings)
        c["sim cannot follow"] += follow
        sim_error = bool(oc.errors_in(report))
        agree = sim_error == (expected is not None)
        if limit:
            c["sim listed limit"] += 1
            if not agree:
                bad.append({"case": str(case), "mode": "simulated", "listed": limit, "real": _msg(real), "doctor": _codes(oc.errors_in(report))})
            continue
        c["sim judged"] += 1
        if agree:
            c["sim agree"] += 1
        else:
            bad.append({"case": str(case), "mode": "simulated", "real": _msg(real), "expected_cuda": expected,
                        "doctor": _codes(report.findings), "cannot follow": follow})
        if clean and expected is None:
            c["sim clean samples"] += 1
            warned = oc.warnings_in(report)
            if warned:
                c["sim clean warn"] += 1
                c["sim clean DD001"] += all(oc.cannot_follow(f) for f in warned)
                bad.append({"case": str(case), "mode": "simulated", "clean": True, "doctor": _codes(warned)})
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
    cols = ["cases", "real errors", "dropped", "as DD001", "false alarms", "clean samples", "clean warn", "sim judged", "sim agree",
            "CUDA differs", "sim cannot follow", "sim listed limit", "sim clean samples", "sim clean warn", "sim clean DD001"]
    print(f"{'family':<15}{'kind':<20}" + "".join(f"{c[:12]:>13}" for c in cols) + f"{'sim %':>8}")
    total: Counter = Counter()
    for (fam, kind), c in sorted(stats.items()):
        total.update(c)
        print(f"{fam:<15}{kind:<20}" + "".join(f"{c[k]:>13}" for k in cols) + f"{_pct(c):>8}")
    print(f"{'all':<35}" + "".join(f"{total[k]:>13}" for k in cols) + f"{_pct(total):>8}")
    print(f"{took:.0f} s")


def _pct(c: Counter) -> str:
    return f"{100 * c['sim agree'] / c['sim judged']:.1f}" if c["sim judged"] else "-"


if __name__ == "__main__":
    raise SystemExit(main())
