"""A generation loop on the simulated GPU vs the same loop on the real CPU.

    A = dtype-doctor run --simulate --gpu a100 --steps NEW+5 -- python benchmarks/user_generate.py NEW
    B = python benchmarks/user_generate.py NEW

The script times its own `generate` (NEW tokens, a tiny Llama from its config) and prints it; the
ratio is A's loop time over B's, pair by pair (A B A B ...), so imports and the report are not in it.
A traces every forward (--steps covers them all), on tensors without data: the loop must end at its
length limit as on the GPU, and run no slower than 3× the real CPU loop. Also printed: the traced
real run (`run --steps`), to tell the simulation's cost from the trace's.

`--threads N` sets OMP_NUM_THREADS for every child. On a loaded 2-core machine the real CPU loop of
this tiny model with torch's default 2 intra-op threads spends most of its time waiting for its
second thread (0.2-0.9 s against 0.025 s with one, measured 2026-11-29), which flatters the ratio;
`--threads 1` gives the CPU loop its quiet-machine pace.

`--hidden H --layers L` run a bigger model of the same shape (default 32 and 2: the per-op cost of the
simulation against the CPU's per-op cost on tensors of a few hundred elements, the hardest case).

`--floors` also runs, in each pair, the same loop under each floor of floor_generate.py (one no-op
dispatch mode on the CPU; a no-op function mode and dispatch mode; the simulated machine alone, with
no recorder; that with the meta-output table) and prints each one's median over B: what no tool of
this kind, and no simulated call of this one, can go under.

`--torch-floor` also runs, in each pair, user_greedy_loop.py's hand-written greedy loop of the same
model on the real CPU and on stand-ins with nothing of the doctor's (bare `meta` tensors; those under a
no-op function mode and dispatch mode; PyTorch's own FakeTensorMode) and prints each one's median
over the CPU loop: the floors under any loop on stand-ins, and under any traced one.

    python benchmarks/bench_simulated_generate.py [--pairs 3] [--new 20] [--threads 1] [--hidden 32 --layers 2] [--floors] [--torch-floor]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, bench_env, cli_command, header, run_timed, verdict  # noqa: E402

LIMIT = 3.0
_LOOP = re.compile(r"generated \(1, (\d+)\) (\S+) ([0-9.]+)s")


def _loop(cmd: list[str], new: int, device: str, threads: int | None) -> float:
    done = run_timed(cmd, env=bench_env(**({"OMP_NUM_THREADS": str(threads)} if threads else {})), ok=(0, 1))
    found = _LOOP.search(done.stderr)
    if found is None or int(found.group(1)) != 8 + new or found.group(2) != device:
        sys.exit(f"bench_simulated_generate: the loop did not finish on {device} under {' '.join(cmd[:4])}:\n{done.stderr[-2000:]}")
    return float(found.group(3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="counted A/B pairs (default 3)")
    ap.add_argument("--new", type=int, default=20, help="tokens generated (default 20)")
    ap.add_argument("--hidden", type=int, default=32, help="the model's hidden size (default 32)")
    ap.add_argument("--layers", type=int, default=2, help="its layers (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for every child (default: inherited)")
    ap.add_argument("--floors", action="store_true", help="also the loop under each floor of floor_generate.py")
    ap.add_argument("--torch-floor", action="store_true", help="also a hand loop on the CPU and on stand-ins without the doctor (user_greedy_loop.py)")
    args = ap.parse_args(argv)
    floors = {}
    if args.floors:
        from floor_generate import LAYERS  # imports torch: only when asked

        floors = {name: [PY, str(BENCH_DIR / "floor_generate.py"), name, *map(str, (args.new, args.hidden, args.layers))]
                  for name in LAYERS}
    floor_ratios: dict[str, list[float]] = {name: [] for name in floors}
    size = [str(args.new), str(args.hidden), str(args.layers)]
    hand = [PY, str(BENCH_DIR / "user_greedy_loop.py")]
    torch_floors = {"meta": ["--meta"], "meta+modes": ["--meta", "--modes"], "FakeTensorMode": ["--fake"]}
    torch_floor: dict[str, list[float]] = {name: [] for name in torch_floors} if args.torch_floor else {}
    script = [str(BENCH_DIR / "user_generate.py"), str(args.new), str(args.hidden), str(args.layers)]
    steps = ["--steps", str(args.new + 5)]
    a_cmd = [*cli_command(), "run", "--simulate", "--gpu", "a100", *steps, "--", "python", *script]
    b_cmd = [PY, *script]
    c_cmd = [*cli_command(), "run", *steps, "--", "python", *script]
    threads = f", OMP_NUM_THREADS={args.threads}" if args.threads else ""
    header(f"bench_simulated_generate: generate({args.new} tokens) simulated vs on the real CPU{threads}",
           [f"A  {' '.join(a_cmd)}", f"B  {' '.join(b_cmd)}", f"C  {' '.join(c_cmd)} (traced, real CPU; shown only)"])
    ratios, traced = [], []
    for _ in range(args.pairs):
        a, b, c = (_loop(a_cmd, args.new, "cuda:0", args.threads), _loop(b_cmd, args.new, "cpu", args.threads),
                   _loop(c_cmd, args.new, "cpu", args.threads))
        ratios.append(a / b)
        traced.append(a / c)
        print(f"  simulated {a:.2f}s  cpu {b:.2f}s  traced cpu {c:.2f}s  ratio {a / b:.2f}", flush=True)
        for name, cmd in floors.items():
            f = _loop(cmd, args.new, "cuda:0" if name.startswith("cuda-view") else "cpu", args.threads)
            floor_ratios[name].append(f / b)
            print(f"    floor {name}: {f:.2f}s, {f / b:.2f}x the cpu loop", flush=True)
        if args.torch_floor:
            real = _loop([*hand, *size], args.new, "cpu", args.threads)
            for name, flags in torch_floors.items():
                f = _loop([*hand, *flags, *size], args.new, "meta" if "--meta" in flags else "cpu", args.threads)
                torch_floor[name].append(f / real)
                print(f"    hand loop on {name}: {f:.2f}s, cpu {real:.2f}s, {f / real:.2f}x", flush=True)
    print(f"  simulated / traced real run: median {statistics.median(traced):.2f}", flush=True)
    for name, got in floor_ratios.items():
        print(f"  floor {name} / cpu loop: median {statistics.median(got):.2f} ({min(got):.2f}-{max(got):.2f})", flush=True)
    for name, got in torch_floor.items():
        print(f"  floor hand loop on {name} / cpu: median {statistics.median(got):.2f} ({min(got):.2f}-{max(got):.2f})", flush=True)
    ok = verdict(f"generate({args.new}) simulated / real CPU loop", statistics.median(ratios), LIMIT,
                 ratio_min=min(ratios), ratio_max=max(ratios), n=len(ratios))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
