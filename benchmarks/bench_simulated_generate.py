"""A generation loop on the simulated GPU vs the same loop on the real CPU.

    A = dtype-doctor run --simulate --gpu a100 --steps NEW+5 -- python benchmarks/user_generate.py NEW
    B = python benchmarks/user_generate.py NEW

The script times its own `generate` (NEW tokens, a tiny Llama from its config) and prints it; the
ratio is A's loop time over B's, pair by pair (A B A B ...), so imports and the report are not in it.
A traces every forward (--steps covers them all), on tensors without data: the loop must end at its
length limit as on the GPU, and run no slower than 3× the real CPU loop. Also printed: the traced
real run (`run --steps`), to tell the simulation's cost from the trace's.

    python benchmarks/bench_simulated_generate.py [--pairs 3] [--new 20]
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


def _loop(cmd: list[str], new: int, device: str) -> float:
    done = run_timed(cmd, env=bench_env(), ok=(0, 1))
    found = _LOOP.search(done.stderr)
    if found is None or int(found.group(1)) != 8 + new or found.group(2) != device:
        sys.exit(f"bench_simulated_generate: the loop did not finish on {device} under {' '.join(cmd[:4])}:\n{done.stderr[-2000:]}")
    return float(found.group(3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="counted A/B pairs (default 3)")
    ap.add_argument("--new", type=int, default=20, help="tokens generated (default 20)")
    args = ap.parse_args(argv)
    script = [str(BENCH_DIR / "user_generate.py"), str(args.new)]
    steps = ["--steps", str(args.new + 5)]
    a_cmd = [*cli_command(), "run", "--simulate", "--gpu", "a100", *steps, "--", "python", *script]
    b_cmd = [PY, *script]
    c_cmd = [*cli_command(), "run", *steps, "--", "python", *script]
    header(f"bench_simulated_generate: generate({args.new} tokens) simulated vs on the real CPU",
           [f"A  {' '.join(a_cmd)}", f"B  {' '.join(b_cmd)}", f"C  {' '.join(c_cmd)} (traced, real CPU; shown only)"])
    ratios, traced = [], []
    for _ in range(args.pairs):
        a, b, c = _loop(a_cmd, args.new, "cuda:0"), _loop(b_cmd, args.new, "cpu"), _loop(c_cmd, args.new, "cpu")
        ratios.append(a / b)
        traced.append(a / c)
        print(f"  simulated {a:.2f}s  cpu {b:.2f}s  traced cpu {c:.2f}s  ratio {a / b:.2f}", flush=True)
    print(f"  simulated / traced real run: median {statistics.median(traced):.2f}", flush=True)
    ok = verdict(f"generate({args.new}) simulated / real CPU loop", statistics.median(ratios), LIMIT,
                 ratio_min=min(ratios), ratio_max=max(ratios), n=len(ratios))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
