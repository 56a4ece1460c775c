"""The floor for bench_compare.py: the same rows `dtype-doctor compare` measures, measured by hand.

Load the model and tokenizer, stream the first N rows and tokenize them (as user_scan.py does),
then for each row build its model as a user would (the fp32 model under torch.autocast, or a
`.half()` / `.bfloat16()` copy; the fp16 + fp32-set row as a `.half()` copy, since nobody searches
the set by hand) and run its forward and backward RUNS times (a loss: the mean of the primary
output in float32, as compare's training loss), timing each; print each row's median time and
its output's largest difference from fp32.

    python benchmarks/user_compare.py MODEL_DIR DATA_FILE N ROWS RUNS
    ROWS: comma-separated, of fp32, autocast-fp16, autocast-bf16, half, bfloat16, fp16-keep-fp32
"""

import copy
import statistics
import sys
import time

import torch
from datasets import load_dataset
from transformers import AutoModel, AutoTokenizer

model_dir, data_file, n, rows, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","), int(sys.argv[5])
builder = {"csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet", "arrow": "arrow"}[data_file.rsplit(".", 1)[-1]]

model = AutoModel.from_pretrained(model_dir)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
texts = [r["text"] for r in load_dataset(builder, data_files={"train": data_file}, streaming=True)["train"].take(n)]
batch = dict(tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt"))

SETUPS = {  # row -> (weights, autocast dtype)
    "fp32": (None, None),
    "autocast-fp16": (None, torch.float16),
    "autocast-bf16": (None, torch.bfloat16),
    "half": (torch.float16, None),
    "bfloat16": (torch.bfloat16, None),
    "fp16-keep-fp32": (torch.float16, None),
}
reference = None
for row in ["fp32", *[r for r in rows if r != "fp32"]]:
    weights, amp = SETUPS[row]
    m = copy.deepcopy(model).to(weights) if weights is not None else model
    times = []
    for _ in range(runs):
        m.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            out = m(**batch).last_hidden_state
        out.float().mean().backward()
        times.append(time.perf_counter() - t0)
    out = out.detach().float()
    reference = out if reference is None else reference
    print(f"{row:<16} {statistics.median(times) * 1000:8.1f} ms   max |diff| {(out - reference).abs().max().item():.3g}")
