"""Simulated scale: `dtype-doctor scan --simulate` on Llama-3 70B and 405B shapes against the fake
forward a user writes by hand, both as whole processes.

    A = dtype-doctor scan MODEL fixtures/data/text-cls --simulate --dtype bfloat16 -f json [CASE'S OPTIONS]
    B = python benchmarks/user_fake_forward.py MODEL
        (import transformers, build the model from its config under FakeTensorMode in bf16 with
        transformers' own initialisation, one forward on 2 x 16 token ids)

    case       model                                         A's options
    70b        80 layers, hidden 8192, FFN 28672, 64/8 heads  -
    405b       126 layers, hidden 16384, FFN 53248, 128/8 heads
    70b-map8   the 70b shape                                  --gpus 8 --device-map auto --gpu h100

The models are config-only directories (bench_simulate_70b.make_model): nothing is allocated
for their weights. Each case: 1 warm-up pair, then --pairs pairs A B A B ...; the figure is the
median per-pair wall ratio, with its min-max and a bootstrap 95 % interval, beside the CPU-time
ratio (user + sys of each child, steadier on a shared machine). The peak RSS is the doctor's own
(wait4). Limits: A/B <= 1.1 and peak RSS <= 1 GiB, each case.

--growth measures how A and B grow: the 70b shape at 10/20/40/80 layers, and the 70b map over
1/2/4/8 GPUs (--growth-pairs pairs each), printed as a table (no limit).

    python benchmarks/bench_simulate_scale.py [--pairs 5] [--cases 70b,405b,70b-map8] [--growth]
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

LIMIT = 1.1
RSS_LIMIT_GIB = 1.0
LLAMA_405B = {**LLAMA_70B, "hidden_size": 16384, "intermediate_size": 53248, "num_attention_heads": 128}
DATA = str(REPO / "fixtures" / "data" / "text-cls")


def scan_cmd(model: Path, *extra: str) -> list[str]:
    return [*cli_command(), "scan", str(model), DATA, "--simulate", "--dtype", "bfloat16", "-f", "json", *extra]


def hand_cmd(model: Path) -> list[str]:
    return [PY, str(BENCH_DIR / "user_fake_forward.py"), str(model)]


def map_opts(gpus: int) -> list[str]:
    return ["--gpus", str(gpus), "--device-map", "auto", "--gpu", "h100"] if gpus > 1 else []


def measure(name: str, a_cmd: list[str], b_cmd: list[str], pairs: int, warmup: int) -> dict:
    print(f"-- {name}", flush=True)
    p = interleave(a_cmd, b_cmd, pairs=pairs, warmup=warmup, env=bench_env(TORCH_LOGS="-all"), ok_a=(0, 1),
                   label_a="doctor", label_b="by hand")
    wall, cpu = spread(p.ratios("wall")), spread(p.ratios("cpu"))
    lo, hi = median_ci(p.ratios("wall"))
    rss = max(r.rss_gib for r in p.a)
    a_s, b_s = spread([r.wall for r in p.a]), spread([r.wall for r in p.b])
    a_cpu, b_cpu = spread([r.cpu for r in p.a]), spread([r.cpu for r in p.b])
    print(f"   wall ratio {wall['median']:.3f} (min {wall['min']:.3f}, max {wall['max']:.3f}, 95 % {lo:.3f}-{hi:.3f}); "
          f"cpu ratio {cpu['median']:.3f} ({cpu['min']:.3f}-{cpu['max']:.3f})", flush=True)
    print(f"   doctor {a_s['median']:.2f} s wall / {a_cpu['median']:.2f} s cpu, peak RSS {rss:.2f} GiB; "
          f"by hand {b_s['median']:.2f} s wall / {b_cpu['median']:.2f} s cpu, peak RSS {max(r.rss_gib for r in p.b):.2f} GiB", flush=True)
    return {"wall": wall, "cpu": cpu, "ci": (lo, hi), "rss": rss, "a": a_s["median"], "b": b_s["median"],
            "a_cpu": a_cpu["median"], "b_cpu": b_cpu["median"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted pairs per case (default 5)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cases", default="70b,405b,70b-map8")
    ap.add_argument("--growth", action="store_true", help="also time 10/20/40/80 layers and 1/2/4/8 GPUs")
    ap.add_argument("--growth-pairs", type=int, default=3)
    args = ap.parse_args(argv)
    header("bench_simulate_scale: scan --simulate (whole process) vs a fake forward by hand (whole process)",
           [f"A  {' '.join(scan_cmd(Path('MODEL')))} [case options]", f"B  {' '.join(hand_cmd(Path('MODEL')))}",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs per case"])
    results = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        models: dict[tuple[str, int], Path] = {}

        def model(shape_name: str, layers: int) -> Path:
            if (shape_name, layers) not in models:
                sub = tmp / f"{shape_name}-{layers}"
                sub.mkdir()
                models[shape_name, layers] = make_model(sub, layers, LLAMA_405B if shape_name == "405b" else LLAMA_70B)
            return models[shape_name, layers]

        cases = {
            "70b": (model("70b", 80), []),
            "405b": (model("405b", 126), []),
            "70b-map8": (model("70b", 80), map_opts(8)),
        }
        for name in args.cases.split(","):
            m, extra = cases[name]
            r = measure(name, scan_cmd(m, *extra), hand_cmd(m), args.pairs, args.warmup)
            ok = r["wall"]["median"] <= LIMIT and r["rss"] <= RSS_LIMIT_GIB
            results.append({"name": f"simulate_{name}", "unit": "x", "measured": round(r["wall"]["median"], 3),
                            "ratio_min": round(r["wall"]["min"], 3), "ratio_max": round(r["wall"]["max"], 3),
                            "ci95": [round(r["ci"][0], 3), round(r["ci"][1], 3)], "cpu_ratio": round(r["cpu"]["median"], 3),
                            "peak_rss_gib": round(r["rss"], 2), "limit": LIMIT, "pass": ok})
        if args.growth:
            rows = []
            for layers in (10, 20, 40, 80):
                m = model("70b", layers)
                r = measure(f"70b shape, {layers} layers", scan_cmd(m), hand_cmd(m), args.growth_pairs, 1)
                rows.append((f"{layers} layers, 1 GPU", r))
            for gpus in (2, 4, 8):
                m = model("70b", 80)
                r = measure(f"70b shape, 80 layers, {gpus} GPUs", scan_cmd(m, *map_opts(gpus)), hand_cmd(m), args.growth_pairs, 1)
                rows.append((f"80 layers, {gpus} GPUs", r))
            print("== growth (medians; the by-hand side has no GPUs: the same 80-layer forward)")
            print(f"   {'case':<20} {'doctor s':>9} {'hand s':>8} {'doctor cpu':>11} {'hand cpu':>9} {'wall ratio':>11} {'cpu ratio':>10} {'RSS GiB':>8}")
            for label, r in rows:
                print(f"   {label:<20} {r['a']:9.2f} {r['b']:8.2f} {r['a_cpu']:11.2f} {r['b_cpu']:9.2f} "
                      f"{r['wall']['median']:11.3f} {r['cpu']['median']:10.3f} {r['rss']:8.2f}")
    for r in results:
        print(f"  => {r['name']}: {r['measured']:.3f}x (95 % {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}; cpu {r['cpu_ratio']:.3f}), "
              f"peak RSS {r['peak_rss_gib']:.2f} GiB (limits {LIMIT}x, {RSS_LIMIT_GIB} GiB): {'PASS' if r['pass'] else 'FAIL'}")
        print(RESULT_PREFIX + __import__("json").dumps(r), flush=True)
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
