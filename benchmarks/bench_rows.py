"""`dtype-doctor scan` on a 3,000,000-row parquet vs a 1,000-row parquet of the same schema.

    A = dtype-doctor scan MODEL big.parquet   (3,000,000 rows)
    B = dtype-doctor scan MODEL small.parquet (1,000 rows)

Both files are written on the fly into a temporary directory by fixtures/generate.py's
make_big_parquet (text-cls schema: text string + label class, rows cycling through the 16
fixture rows, row groups of 100,000). Only the first --batch-size rows should be read, so
the row count should cost (almost) nothing. Target: median per-pair ratio A/B ≤ 1.1.

As a finer view it also times the read step alone (dtype_doctor.load.load_rows) on both
files in one separate process, A B A B ..., where interpreter start and imports do not
dilute the difference.

    python benchmarks/bench_rows.py [--pairs 5] [--rows 3000000] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PY, REPO, bench_env, cli_command, fmt_spread, header, interleave, print_pairs_summary, run_timed, spread, verdict  # noqa: E402

LIMIT = 1.1

# Runs in a child: time load_rows on both files, alternating, after one warm-up each.
_READ_ONLY = r"""
import json, sys, time
from dtype_doctor.load import load_rows
big, small, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def t(path):
    t0 = time.perf_counter(); rows = load_rows(path, n=n); dt = time.perf_counter() - t0
    assert rows.num_rows_read == n, rows.num_rows_read
    return dt
t(big); t(small)
a, b = [], []
for _ in range(reps):
    a.append(t(big)); b.append(t(small))
print(json.dumps({"big": a, "small": b}))
"""


def make_files(tmp: Path, rows: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(REPO / "fixtures"))
    from generate import make_big_parquet  # noqa: PLC0415 - numpy + pyarrow only

    return make_big_parquet(tmp / "big.parquet", rows), make_big_parquet(tmp / "small.parquet", 1000)


def describe(path: Path) -> str:
    import pyarrow.parquet as pq  # noqa: PLC0415

    md = pq.ParquetFile(path).metadata
    return f"{path.name}: {md.num_rows:,} rows, {md.num_row_groups} row group(s), {path.stat().st_size:,} bytes on disk"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5, help="counted A/B pairs (at least 5; default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted A/B pairs first (default 1)")
    ap.add_argument("--rows", type=int, default=3_000_000, help="rows in the big file (default 3,000,000)")
    ap.add_argument("--batch-size", type=int, default=2, help="--batch-size for both scans (default 2, the CLI default)")
    ap.add_argument("--model", default=str(REPO / "fixtures/models/bert-tiny"), help="model directory (default: fixtures/models/bert-tiny)")
    ap.add_argument("--read-reps", type=int, default=5, help="load_rows pairs in the read-only view (0 skips it)")
    args = ap.parse_args(argv)
    if args.pairs < 5:
        ap.error("--pairs must be at least 5")

    env = bench_env()
    with tempfile.TemporaryDirectory(prefix="dd-bench-rows-") as tmp:
        big, small = make_files(Path(tmp), args.rows)
        n = str(args.batch_size)
        a_cmd = [*cli_command(), "scan", args.model, str(big), "--batch-size", n]
        b_cmd = [*cli_command(), "scan", args.model, str(small), "--batch-size", n]
        header(
            "bench_rows: `dtype-doctor scan` on a big parquet vs a small one (same schema, same model)",
            [
                describe(big),
                describe(small),
                f"A  {' '.join(a_cmd)}",
                f"B  {' '.join(b_cmd)}",
                f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...; whole processes, wall clock",
            ],
        )
        pairs = interleave(a_cmd, b_cmd, pairs=args.pairs, warmup=args.warmup, env=env, ok_a=(0, 1), ok_b=(0, 1), label_a="big", label_b="small")
        r = print_pairs_summary(pairs, "big", "small")

        if args.read_reps > 0:
            out = run_timed([PY, "-c", _READ_ONLY, str(big), str(small), n, str(args.read_reps)], env=env)
            times = json.loads(out.stdout.strip().splitlines()[-1])
            ratios = [a / b for a, b in zip(times["big"], times["small"])]
            print("  read step only (dtype_doctor.load.load_rows, one process, after warm-up):")
            print(f"    big    {fmt_spread(spread([t * 1000 for t in times['big']]), ' ms', 1)}")
            print(f"    small  {fmt_spread(spread([t * 1000 for t in times['small']]), ' ms', 1)}")
            print(f"    ratio  {fmt_spread(spread(ratios))}")

        ok = verdict(
            f"scan {args.rows:,}-row vs 1,000-row parquet",
            r["median"],
            LIMIT,
            ratio_min=r["min"],
            ratio_max=r["max"],
            n=r["n"],
            big_bytes=big.stat().st_size,
            small_bytes=small.stat().st_size,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
