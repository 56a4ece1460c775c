"""The baseline for bench_scan.py: what a user writes by hand to push the first rows of a
dataset through a model, with the same libraries and the same steps `dtype-doctor scan` takes
(load model + tokenizer, stream the first N rows, tokenize, one forward without gradients).

    python benchmarks/user_scan.py MODEL_DIR DATA_FILE N
"""

import sys

import torch
from datasets import load_dataset
from transformers import AutoModel, AutoTokenizer

model_dir, data_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
builder = {"csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet", "arrow": "arrow"}[data_file.rsplit(".", 1)[-1]]

model = AutoModel.from_pretrained(model_dir)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
rows = list(load_dataset(builder, data_files={"train": data_file}, streaming=True)["train"].take(n))
batch = tokenizer([r["text"] for r in rows], padding=True, truncation=True, max_length=128, return_tensors="pt")
with torch.no_grad():
    out = model(**batch)
print(f"{type(model).__name__} {tuple(out.last_hidden_state.shape)} {out.last_hidden_state.dtype}")
