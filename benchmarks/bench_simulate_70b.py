"""A simulated 70B step: what the kernel probes cost on a Llama-3-70B-shaped model.

`--simulate --device cuda --dtype bfloat16` on a config-only directory with Llama 3 70B's
shapes (80 layers, hidden 8192, 28672 FFN, 64 heads / 8 KV heads, 128256 vocab): nothing is
allocated for the 70B weights (fake tensors). A is the trace with the kernel probes that
decide simulated verdicts (trace/probe.py); B the same trace with the probes answering from
the rules only (what simulation did before). Both run in one process, A B A B …, after a
warm-up; the figure is the median of per-pair ratios. Targets: A / B ≤ 1.3, one A trace
≤ 60 s, peak RSS ≤ 4 GiB (the probes' small real tensors are the only data).

Usage: python benchmarks/bench_simulate_70b.py [--pairs 3] [--layers 80]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, RESULT_PREFIX  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_LOGS", "-all")

LLAMA_70B = {
    "hidden_size": 8192, "intermediate_size": 28672, "head_dim": 128, "tie_word_embeddings": False, "num_attention_heads": 64, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
}


def make_model(tmp: Path, layers: int, shape: dict | None = None, name: str = "llama-70b-config-only") -> Path:
    """A config-only Llama directory (llama-tiny's tokenizer) with `shape` (default LLAMA_70B) and `layers`."""
    src = REPO / "fixtures" / "models" / "llama-tiny"
    config = json.loads((src / "config.json").read_text())
    config.update(LLAMA_70B if shape is None else shape, num_hidden_layers=layers)
    out = tmp / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--layers", type=int, default=80)
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(2)
    from dtype_doctor.pipeline import ScanOptions, prepare
    from dtype_doctor.rules import refusal
    from dtype_doctor.trace import engine, probe

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp), a.layers)
        options = ScanOptions(simulate=True, device="cuda", dtype="bfloat16", batch_size=2)
        prepared = prepare(str(model_dir), str(REPO / "fixtures" / "data" / "text-cls"), options)
        model, batch, request = prepared.loaded.model, prepared.batch.inputs, prepared.request()
        n_params = sum(t.numel() for t in model.parameters())

        real_call = probe.KernelProbe.__call__

        def rules_only(self, func, args, kwargs, op):  # noqa: ANN001, ANN202
            return self.fallback(op) if self.fallback else None

        def traced(with_probes: bool) -> tuple[float, object]:
            probe.KernelProbe.__call__ = real_call if with_probes else rules_only
            try:
                start = time.perf_counter()
                trace = engine.trace_model(model, batch, request, refusal=refusal)
                return time.perf_counter() - start, trace
            finally:
                probe.KernelProbe.__call__ = real_call

        traced(True), traced(False)  # warm-up
        ratios, a_times, b_times = [], [], []
        for _ in range(a.pairs):
            ta, trace_a = traced(True)
            tb, trace_b = traced(False)
            ratios.append(ta / tb)
            a_times.append(ta)
            b_times.append(tb)
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        errors = [op.op for op in trace_a.ops if op.error]
    ratio, a_med = statistics.median(ratios), statistics.median(a_times)
    results = [
        {"name": "simulate_70b_ratio", "unit": "x", "measured": round(ratio, 3), "ratio_min": round(min(ratios), 3),
         "ratio_max": round(max(ratios), 3), "limit": 1.3, "pass": ratio <= 1.3},
        {"name": "simulate_70b_time", "unit": "s", "measured": round(a_med, 3), "min": round(min(a_times), 3),
         "max": round(max(a_times), 3), "limit": 60, "pass": a_med <= 60},
        {"name": "simulate_70b_rss", "unit": "bool", "measured": peak_gib <= 4, "shown": f"{peak_gib:.2f} GiB peak RSS",
         "pass": peak_gib <= 4},
    ]
    result = {"ratio": round(ratio, 3), "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
              "probes_s": round(a_med, 2), "rules_only_s": round(statistics.median(b_times), 2), "peak_rss_gib": round(peak_gib, 2)}
    print(f"Llama-70B shape, {a.layers} layers, {n_params / 1e9:.1f} B parameters (fake), {len(trace_a.ops)} ops traced")
    print(f"with probes {result['probes_s']} s, rules only {result['rules_only_s']} s: "
          f"ratio {result['ratio']} ({result['ratio_min']}-{result['ratio_max']}); peak RSS {result['peak_rss_gib']} GiB")
    print(f"{len(errors)} ops refused")
    for r in results:
        print(RESULT_PREFIX + json.dumps(r))
    return 0 if all(r["pass"] for r in results) else 1

if __name__ == "__main__":
    raise SystemExit(main())
