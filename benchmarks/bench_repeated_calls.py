"""`dtype-doctor run -- python SCRIPT` vs `python SCRIPT`, for a script whose one step calls its
model 50 times: a diffusion pipeline's denoising loop (issue 42).

    A = dtype-doctor run -- python benchmarks/user_pipeline_loop.py STEPS
    B = python benchmarks/user_pipeline_loop.py STEPS

The step is the whole pipeline call; the UNet's first call is traced, its STEPS-1 repeats (and the
negative prompt's text-encoder call) run unwatched, the recorder off, while nothing the step ran
needed a repair (coverage.skipped.unwatched counts them). Whole processes, interleaved pairs, CPU
time (user+sys) of each child. Target: median per-pair CPU ratio A/B ≤ 1.3.

    python benchmarks/bench_repeated_calls.py [--pairs 5] [--warmup 1] [--steps 50] [--threads N]

`--threads N` sets OMP_NUM_THREADS for both children: on a loaded machine the CPU time of torch's
second thread, spinning while it waits for its time slice, swells both sides and flatters the ratio;
with one thread each side's CPU time is its own work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, bench_env, cli_command, header, interleave, print_pairs_summary, spread, verdict  # noqa: E402

LIMIT = 1.3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted A/B pairs (at least 3; default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted A/B pairs first (default 1)")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps: the UNet's calls in the one step (default 50)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both children (default: torch's own)")
    args = ap.parse_args(argv)
    if args.pairs < 3:
        ap.error("--pairs must be at least 3")
    script = [str(BENCH_DIR / "user_pipeline_loop.py"), str(args.steps)]
    a_cmd = [*cli_command(), "run", "-f", "json", "--", "python", *script]
    b_cmd = [PY, *script]
    header(f"bench_repeated_calls: `dtype-doctor run` vs `python`, one pipeline call, {args.steps} UNet calls",
           [f"A  {' '.join(a_cmd)}", f"B  {' '.join(b_cmd)}",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...; whole processes, CPU time of each child"
            + (f"; OMP_NUM_THREADS={args.threads}" if args.threads else "")])
    env = bench_env(**({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    pairs = interleave(a_cmd, b_cmd, pairs=args.pairs, warmup=args.warmup, env=env, ok_a=(0, 1), label_a="run", label_b="python")
    last = pairs.a[-1]
    if "image" not in last.stderr or not last.stdout.strip():
        sys.exit("bench_repeated_calls: the pipeline did not finish under dtype-doctor run, or no report was printed")
    skipped = json.loads(last.stdout).get("coverage", {}).get("skipped", {})
    print(f"  run exit code {last.rc}; coverage.skipped {skipped}")
    print_pairs_summary(pairs, "run", "python")
    r = spread(pairs.ratios("cpu"))
    ok = verdict(f"run vs python, CPU time, one step of {args.steps} repeated model calls", r["median"], LIMIT,
                 ratio_min=r["min"], ratio_max=r["max"], n=r["n"], unwatched=skipped.get("unwatched", 0), threads=args.threads)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
