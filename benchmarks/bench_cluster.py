"""Cluster scale: simulated scans of Llama-3-70B and 405B shapes, a 70B device map over 8 GPUs,
and FSDP2 on an 8B shape at world size 64 — each a whole `dtype-doctor` process (or, for FSDP2, a
python process using the API), timed end to end with its peak RSS.

    case                                   limit
    70b   scan --simulate                   ≤ 5 s wall, ≤ 1 GiB peak RSS
    405b  scan --simulate (126 layers, hidden 16384)   ≤ 10 s
    70b-map8  scan --simulate --gpus 8 --device-map auto   ≤ 10 s
    fsdp2-8b-w64  fully_shard per layer, world 64, forward + backward traced   ≤ 30 s

Growth: `--layers` and `--gpus`/`--world` change the shapes (the figures: benchmarks/README.md).
The machine may be shared: each case runs `--repeat` times and the median is reported.

    python benchmarks/bench_cluster.py [--repeat 3] [--cases 70b,405b,70b-map8,fsdp2-8b-w64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PY, REPO, RESULT_PREFIX, cli_command  # noqa: E402
from bench_simulate_70b import LLAMA_70B, make_model  # noqa: E402

LLAMA_405B = {**LLAMA_70B, "hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128}
LLAMA_8B = {**LLAMA_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32}
DATA = str(REPO / "fixtures" / "data" / "text-cls")

FSDP_SCRIPT = """
import sys, time, torch, dtype_doctor
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from dtype_doctor.machine.placement import Placement
from dtype_doctor.load import load_model
model_dir, world = sys.argv[1], int(sys.argv[2])
loaded = load_model(model_dir, placement=Placement("cpu", simulated=True), dtype="bfloat16")
model, fake = loaded.model, loaded.fake_mode
with dtype_doctor.fake_world(world) as mesh, fake:
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    ids = torch.zeros(1, 16, dtype=torch.long)
    report = dtype_doctor.diagnose(model, {"input_ids": ids, "labels": ids}, train=True)
print(len(report.trace.ops), "ops;", sorted({f.code for f in report.findings}), report.target.world, file=sys.stderr)
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS GiB, exit code, CPU seconds) of one process. On a shared machine the
    CPU seconds (user + system) say what the work costs; the wall clock adds the wait for a core."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        print(err[-2000:], file=sys.stderr)
    return wall, usage.ru_maxrss / 2**20, code, usage.ru_utime + usage.ru_stime


def shaped(tmp: Path, name: str, shape: dict, layers: int) -> str:
    # make_model's `shape` argument: the module-level LLAMA_70B is never cleared (clearing it while
    # `shape` was that same dict once gave the 70b case llama-tiny's 32-wide shapes with 80 layers).
    sub = tmp / name
    sub.mkdir()
    return str(make_model(sub, layers, shape))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="70b,405b,70b-map8,fsdp2-8b-w64")
    ap.add_argument("--layers", type=int, default=None, help="override every case's layer count (growth)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--world", type=int, default=64)
    a = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_LOGS": "-all", "PYTHONPATH": str(REPO)}
    scan = [*cli_command(), "scan"]
    results = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        m70 = shaped(tmp, "70b", LLAMA_70B, a.layers or 80)
        cases = {
            "70b": ([*scan, m70, DATA, "--simulate", "--dtype", "bfloat16", "-f", "json"], 5.0, 1.0),
            "405b": ([*scan, shaped(tmp, "405b", LLAMA_405B, a.layers or 126), DATA, "--simulate", "--dtype", "bfloat16", "-f", "json"], 10.0, None),
            "70b-map8": ([*scan, m70, DATA, "--simulate", "--dtype", "bfloat16", "--gpus", str(a.gpus), "--device-map", "auto", "--gpu", "h100", "-f", "json"], 10.0, None),
            "fsdp2-8b-w64": ([PY, "-c", FSDP_SCRIPT, shaped(tmp, "8b", LLAMA_8B, a.layers or 32), str(a.world)], 30.0, None),
        }
        for name in a.cases.split(","):
            cmd, limit, rss_limit = cases[name]
            runs = [timed(cmd, env) for _ in range(a.repeat)]
            walls, rss = [r[0] for r in runs], max(r[1] for r in runs)
            wall, cpu = statistics.median(walls), statistics.median(r[3] for r in runs)
            ok = wall <= limit and (rss_limit is None or rss <= rss_limit) and all(r[2] in (0, 1) for r in runs)
            print(f"{name:14s} median {wall:6.2f} s wall (min {min(walls):.2f}, max {max(walls):.2f}), {cpu:.2f} s CPU · peak RSS {rss:.2f} GiB · "
                  f"limit {limit} s{f', {rss_limit} GiB' if rss_limit else ''} · {'PASS' if ok else 'FAIL'}")
            results.append({"name": f"cluster_{name}", "unit": "s", "measured": round(wall, 2), "min": round(min(walls), 2),
                            "max": round(max(walls), 2), "cpu_s": round(cpu, 2), "peak_rss_gib": round(rss, 2), "limit": limit, "pass": ok})
    for r in results:
        print(RESULT_PREFIX + json.dumps(r))
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
