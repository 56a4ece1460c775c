"""The oracle sweep on a real GPU: real CUDA kernels judge the simulation and the CPU↔CUDA table.

oracle_sweep.py, on a CPU-only machine, can only judge simulated CUDA verdicts against the real
CPU outcome turned into CUDA's by PyTorch's declarations. With a GPU, every case of the same
op_db / module_db sweep is called for real on CUDA, and three things are counted against that:

  declared  tests/opdb_cases.expected_on_cuda (op_db's CUDA dtype lists + the kernel facts)
            predicts the real CUDA outcome: the proxy CPU-only CI uses is right
  normal    diagnose(device="cuda:0"): real CUDA error ⇔ an error-level finding
  simulated diagnose(simulate=True, device="cuda", gpu=<this GPU>): a CPU-only runner's verdict
            for this GPU ⇔ the real CUDA outcome (the listed SIMULATION_LIMITS apart)

and `cuda≠cpu` counts the cases where the real CUDA outcome differs from this machine's CPU.
Every disagreement goes to --json with both messages.

A case whose CPU call fails on values (an index out of range) is not sent to the GPU: on CUDA it
is a device-side assert that poisons the process. If a kernel still poisons it, the sweep stops,
prints `POISONED <n>`, and `--start <n+1>` resumes after it.

Usage: python benchmarks/oracle_cuda.py [--samples 2] [--only NAME,…] [--start N] [--shard I/N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_LOGS", "-all")

COLS = ["cases", "cpu errors", "cuda errors", "cuda≠cpu", "declared ok", "normal ok", "dropped", "false alarms",
        "sim judged", "sim agree", "sim listed limit", "skipped"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--only", default="")
    p.add_argument("--start", type=int, default=0, help="skip the first N cases (resume after a poisoned context)")
    p.add_argument("--shard", default="0/1", help="I/N: this process takes every N-th case from the I-th (parallel runs)")
    p.add_argument("--json", default="")
    p.add_argument("--kinds", default="perturbed,clean,error-input,module,module-clean,module-error-input")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if not torch.cuda.is_available():
        print("no CUDA device: this sweep needs a GPU (benchmarks/oracle_sweep.py is the CPU one)", file=sys.stderr)
        return 2
    import opdb_cases as oc

    major, minor = torch.cuda.get_device_capability()
    gpu = f"{major}.{minor}"
    only = set(filter(None, a.only.split(",")))
    stats: dict[tuple[str, str], Counter] = defaultdict(Counter)
    bad: list[dict] = []
    start = time.perf_counter()
    print(f"{torch.cuda.get_device_name()} (sm_{major}{minor}) · torch {torch.__version__}", flush=True)
    signal.signal(signal.SIGTERM, _stop)  # `timeout` ends it: the figures so far are still printed
    try:
        cut = _sweep(a, oc, only, stats, bad, gpu)
    except KeyboardInterrupt:
        cut = None
        print("stopped early: the figures cover the cases before it", flush=True)
    _finish(stats, bad, a.json, start)
    if cut is not None:
        print(f"POISONED {cut}", flush=True)
        return 3
    return 0


def _stop(*_: object) -> None:
    raise KeyboardInterrupt


def _sweep(a: argparse.Namespace, oc, only: set, stats: dict, bad: list, gpu: str) -> int | None:  # noqa: ANN001
    """Run the cases; the index of a case that poisoned the CUDA context, or None."""
    from oracle_sweep import _codes, _msg

    shard, shards = (int(x) for x in a.shard.split("/"))
    n = -1
    for case in oc.cases(samples_per_op=a.samples, kinds=tuple(a.kinds.split(","))):
        if only and case.op.split(".")[0] not in only and case.op not in only:
            continue
        n += 1
        if n < a.start or n % shards != shard:
            continue
        c = stats[(case.family, case.kind)]
        c["cases"] += 1
        print(f"case {n}: {case}", file=sys.stderr, flush=True)  # a kernel that ends the process is named
        cpu = oc.real_error(case)
        c["cpu errors"] += cpu is not None
        if cpu is not None and oc.simulation_limit(case, cpu) and "values" in oc.simulation_limit(case, cpu):
            c["skipped"] += 1
            continue
        cuda = oc.real_error(case, "cuda:0")
        if cuda is not None and _poisoned(cuda):
            bad.append({"case": str(case), "n": n, "poisoned": _msg(cuda)})
            return n
        c["cuda errors"] += cuda is not None
        row = {"case": str(case), "cpu": _msg(cpu), "cuda": _msg(cuda)}
        if (cpu is None) != (cuda is None):
            c["cuda≠cpu"] += 1
            bad.append({**row, "kind": "cuda≠cpu"})
        expected = oc.expected_on_cuda(case, cpu)
        if (expected is None) == (cuda is None):
            c["declared ok"] += 1
        else:
            bad.append({**row, "kind": "declared wrong", "declared": expected})
        try:
            normal = oc.errors_in(oc.doctor_report(case, device="cuda:0"))
            if bool(normal) == (cuda is not None):
                c["normal ok"] += 1
            else:
                c["dropped" if cuda is not None else "false alarms"] += 1
                bad.append({**row, "kind": "normal", "doctor": _codes(normal)})
        except Exception as exc:  # noqa: BLE001 - a crash of the tool is a disagreement too
            bad.append({**row, "kind": "normal crash", "crash": repr(exc)[:300]})
        limit = oc.simulation_limit(case, cuda)
        try:
            report = oc.doctor_report(case, simulate=True, device="cuda", gpu=gpu)
        except Exception as exc:  # noqa: BLE001
            bad.append({**row, "kind": "simulated crash", "crash": repr(exc)[:300]})
            continue
        agree = bool(oc.errors_in(report)) == (cuda is not None)
        if limit:
            c["sim listed limit"] += 1
            continue
        c["sim judged"] += 1
        c["sim agree"] += agree
        if not agree:
            bad.append({**row, "kind": "simulated", "doctor": _codes(report.findings)})
    return None


def _poisoned(exc: BaseException) -> bool:
    text = str(exc)
    return "device-side assert" in text or "an illegal memory access" in text or "unspecified launch failure" in text


def _finish(stats: dict, bad: list[dict], path: str, start: float) -> None:
    took = time.perf_counter() - start
    print(f"{'family':<15}{'kind':<20}" + "".join(f"{c[:12]:>13}" for c in COLS))
    total: Counter = Counter()
    for (fam, kind), c in sorted(stats.items()):
        total.update(c)
        print(f"{fam:<15}{kind:<20}" + "".join(f"{c[k]:>13}" for k in COLS))
    print(f"{'all':<35}" + "".join(f"{total[k]:>13}" for k in COLS))
    print(f"{took:.0f} s")
    if path:
        Path(path).write_text(json.dumps(bad, indent=1))
    print("BENCH-RESULT " + json.dumps({"name": "oracle_cuda", **total, "seconds": round(took, 1)}))


if __name__ == "__main__":
    raise SystemExit(main())
