"""Run every benchmark, each in its own fresh process, and print one table at the end.

    python benchmarks/run_all.py [--only diagnose,scan,rows,run,run10,repeated,simulate,scale,help,compare]

Each script's own output streams through as it runs; the table lists target, measured
figure, min–max across pairs, and pass/fail. Exit status 0 when every target is met,
1 when one is missed, 2 when a script failed to produce its result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, REPO, RESULT_PREFIX  # noqa: E402

SCRIPTS = {
    "diagnose": ("bench_diagnose.py", "diagnose() / plain forward, MiniLM 32x128: with value statistics; stats=False", "≤ 1.20×; ≤ 1.10×"),
    "scan": ("bench_scan.py", "dtype-doctor scan / user script, end to end", "≤ 1.3×"),
    "rows": ("bench_rows.py", "scan 3,000,000-row / 1,000-row parquet", "≤ 1.1×"),
    "run": ("bench_run.py", "dtype-doctor run / python, one training step, CPU time", "≤ 1.5×"),
    "run10": ("bench_run.py --steps 10", "dtype-doctor run --steps 10 / python, ten training steps, CPU time", "≤ 1.3×"),
    "repeated": ("bench_repeated_calls.py", "dtype-doctor run / python, one pipeline call of 50 UNet calls, CPU time", "≤ 1.3×"),
    "simulate": ("bench_simulate_70b.py", "--simulate on Llama-70B shapes: with / without kernel probes; one trace; peak RSS", "≤ 1.3×; ≤ 60 s; ≤ 4 GiB"),
    "scale": ("bench_simulate_scale.py", "scan --simulate 70B, 405B, 70B over 8 GPUs / a fake forward by hand; peak RSS", "≤ 1.1×; ≤ 1 GiB"),
    "help": ("bench_help.py", "dtype-doctor --help wall time; torch not imported", "≤ 0.3 s; no"),
    "compare": ("bench_compare.py", "dtype-doctor compare / the same six rows by hand (forward + backward, as many runs), MiniLM", "≤ 3×"),
}


def shown(r: dict) -> tuple[str, str]:
    if r["unit"] == "bool":
        return r.get("shown", str(r["measured"])), ""
    if r["unit"] == "s":
        return f"{r['measured']:.3f} s", f"{r.get('min', float('nan')):.3f}–{r.get('max', float('nan')):.3f} s"
    return f"{r['measured']:.3f}×", f"{r.get('ratio_min', float('nan')):.3f}–{r.get('ratio_max', float('nan')):.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(SCRIPTS))
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(SCRIPTS)
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")

    rows: list[tuple[str, str, str, str, str]] = []
    failed_scripts: list[str] = []
    started = time.perf_counter()
    for name in names:
        script, what, target = SCRIPTS[name]
        t0 = time.perf_counter()
        script, *script_args = script.split()
        proc = subprocess.Popen([PY, str(BENCH_DIR / script), *script_args], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        results = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(RESULT_PREFIX):
                results.append(json.loads(line[len(RESULT_PREFIX):]))
            else:
                print(line, end="", flush=True)
        rc = proc.wait()
        print(f"   ({script} took {time.perf_counter() - t0:.1f} s)\n", flush=True)
        if not results:
            failed_scripts.append(script)
            rows.append((what, target, "no result", "", f"ERROR (exit {rc})"))
            continue
        measured = []
        spans = []
        for r in results:
            m, s = shown(r)
            measured.append(m)
            if s:
                spans.append(s)
        verdict = "PASS" if all(r["pass"] for r in results) else "FAIL"
        rows.append((what, target, "; ".join(measured), "; ".join(spans), verdict))

    head = ("benchmark", "target", "measured (median)", "min–max", "result")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    print(f"== summary ({time.perf_counter() - started:.0f} s in all, {os.cpu_count()} CPU(s) visible)")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print(line)
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if failed_scripts:
        return 2
    return 0 if all(r[4] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
