"""Simulated scale: `dtype-doctor scan --simulate` on Llama-3 8B, 70B and 405B shapes against the
same work done by hand, both as whole processes.

    A = dtype-doctor scan MODEL fixtures/data/text-cls --simulate --dtype bfloat16 -f json [CASE'S OPTIONS]
    B = python benchmarks/user_fake_forward.py MODEL fixtures/data/text-cls
        (import datasets and transformers, read and tokenize the same 2 rows, build the model from its
        config under FakeTensorMode in bf16 with transformers' own initialisation, one forward)

    case         model                                          A's options
    8b           32 layers, hidden 4096, FFN 14336, 32/8 heads   -
    70b          80 layers, hidden 8192, FFN 28672, 64/8 heads   -
    405b         126 layers, hidden 16384, FFN 53248, 128/8 heads
    405b-whole   the 405b shape                                 --no-share-layers (every layer traced)
    70b-map8     the 70b shape                                  --gpus 8 --device-map auto --gpu h100

The models are config-only directories (bench_simulate_70b.make_model): nothing is allocated
for their weights. Each case: 1 warm-up pair, then --pairs pairs A B A B ...; the figure is the
median per-pair ratio of CPU time (user + sys of each child process: steadier than wall time on a
shared machine), with its min-max and a bootstrap 95 % interval, beside the wall ratio. The peak
RSS is the doctor's own (wait4). Limits: A/B <= 1.2 in CPU time and peak RSS <= 1 GiB, each case
(405b-whole has no limit: it shows what sharing the layers saves). The table at the end shows how
the ratio moves from 8B to 405B.

    python benchmarks/bench_simulate_scale.py [--pairs 5] [--cases 8b,70b,405b,405b-whole,70b-map8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, REPO, bench_env, cli_command, header, interleave, median_ci, spread  # noqa: E402
from _common import RESULT_PREFIX  # noqa: E402
from bench_simulate_70b import LLAMA_70B, make_model  # noqa: E402

LIMIT = 1.2
NO_LIMIT = frozenset({"405b-whole"})
RSS_LIMIT_GIB = 1.0
LLAMA_405B = {**LLAMA_70B, "hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128}
LLAMA_8B = {**LLAMA_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32}
SHAPES = {"8b": (LLAMA_8B, 32), "70b": (LLAMA_70B, 80), "405b": (LLAMA_405B, 126)}
DATA = str(REPO / "fixtures" / "data" / "text-cls")


def scan_cmd(model: Path, *extra: str) -> list[str]:
    return [*cli_command(), "scan", str(model), DATA, "--simulate", "--dtype", "bfloat16", "-f", "json", *extra]


def hand_cmd(model: Path) -> list[str]:
    return [PY, str(BENCH_DIR / "user_fake_forward.py"), str(model), DATA]


def map_opts(gpus: int) -> list[str]:
    return ["--gpus", str(gpus), "--device-map", "auto", "--gpu", "h100"] if gpus > 1 else []


def measure(name: str, a_cmd: list[str], b_cmd: list[str], pairs: int, warmup: int) -> dict:
    print(f"-- {name}", flush=True)
    p = interleave(a_cmd, b_cmd, pairs=pairs, warmup=warmup, env=bench_env(TORCH_LOGS="-all"), ok_a=(0, 1),
                   label_a="doctor", label_b="by hand")
    wall, cpu = spread(p.ratios("wall")), spread(p.ratios("cpu"))
    lo, hi = median_ci(p.ratios("cpu"))
    rss = max(r.rss_gib for r in p.a)
    a_s, b_s = spread([r.wall for r in p.a]), spread([r.wall for r in p.b])
    a_cpu, b_cpu = spread([r.cpu for r in p.a]), spread([r.cpu for r in p.b])
    print(f"   cpu ratio {cpu['median']:.3f} (min {cpu['min']:.3f}, max {cpu['max']:.3f}, 95 % {lo:.3f}-{hi:.3f}); "
          f"wall ratio {wall['median']:.3f} ({wall['min']:.3f}-{wall['max']:.3f})", flush=True)
    print(f"   doctor {a_s['median']:.2f} s wall / {a_cpu['median']:.2f} s cpu, peak RSS {rss:.2f} GiB; "
          f"by hand {b_s['median']:.2f} s wall / {b_cpu['median']:.2f} s cpu, peak RSS {max(r.rss_gib for r in p.b):.2f} GiB", flush=True)
    return {"wall": wall, "cpu": cpu, "ci": (lo, hi), "rss": rss, "a": a_s["median"], "b": b_s["median"],
            "a_cpu": a_cpu["median"], "b_cpu": b_cpu["median"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted pairs per case (default 5)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cases", default="8b,70b,405b,405b-whole,70b-map8")
    args = ap.parse_args(argv)
    header("bench_simulate_scale: scan --simulate (whole process) vs a fake forward by hand (whole process)",
           [f"A  {' '.join(scan_cmd(Path('MODEL')))} [case options]", f"B  {' '.join(hand_cmd(Path('MODEL')))}",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs per case"])
    results, rows = [], []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        models: dict[str, Path] = {}

        def model(shape_name: str) -> Path:
            if shape_name not in models:
                sub = tmp / shape_name
                sub.mkdir()
                shape, layers = SHAPES[shape_name]
                models[shape_name] = make_model(sub, layers, shape)
            return models[shape_name]

        cases = {
            "8b": ("8b", []),
            "70b": ("70b", []),
            "405b": ("405b", []),
            "405b-whole": ("405b", ["--no-share-layers"]),
            "70b-map8": ("70b", map_opts(8)),
        }
        for name in args.cases.split(","):
            shape_name, extra = cases[name]
            m = model(shape_name)
            r = measure(name, scan_cmd(m, *extra), hand_cmd(m), args.pairs, args.warmup)
            rows.append((name, r))
            ok = name in NO_LIMIT or (r["cpu"]["median"] <= LIMIT and r["rss"] <= RSS_LIMIT_GIB)
            results.append({"name": f"simulate_{name}", "unit": "x", "measured": round(r["cpu"]["median"], 3),
                            "ratio_min": round(r["cpu"]["min"], 3), "ratio_max": round(r["cpu"]["max"], 3),
                            "ci95": [round(r["ci"][0], 3), round(r["ci"][1], 3)], "wall_ratio": round(r["wall"]["median"], 3),
                            "peak_rss_gib": round(r["rss"], 2), "limit": None if name in NO_LIMIT else LIMIT, "pass": ok})
    print("== how the ratio moves with the model (medians; CPU seconds of each child process)")
    print(f"   {'case':<12} {'doctor cpu':>11} {'hand cpu':>9} {'cpu ratio':>10} {'min-max':>13} {'wall ratio':>11} {'RSS GiB':>8}")
    for label, r in rows:
        print(f"   {label:<12} {r['a_cpu']:11.2f} {r['b_cpu']:9.2f} {r['cpu']['median']:10.3f} "
              f"{r['cpu']['min']:6.3f}-{r['cpu']['max']:.3f} {r['wall']['median']:11.3f} {r['rss']:8.2f}")
    for r in results:
        print(f"  => {r['name']}: cpu {r['measured']:.3f}x (min {r['ratio_min']:.3f}, max {r['ratio_max']:.3f}; wall {r['wall_ratio']:.3f}), "
              f"peak RSS {r['peak_rss_gib']:.2f} GiB (limits {r['limit']}x, {RSS_LIMIT_GIB} GiB): {'PASS' if r['pass'] else 'FAIL'}")
        print(RESULT_PREFIX + __import__("json").dumps(r), flush=True)
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
