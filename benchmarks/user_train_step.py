"""The script bench_run.py runs both ways: one training step of MiniLM with a classification
head, written as a user writes it (DataLoader over tokenized rows, forward with labels,
backward, AdamW step), stopping after STEPS steps (default 1; epochs over the rows as needed).

    python benchmarks/user_train_step.py MODEL_DIR DATA_FILE N [STEPS]
"""

import sys

import torch
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model_dir, data_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=3)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
rows = load_dataset("parquet", data_files={"train": data_file})["train"]


def tokenize(batch):
    return tokenizer(batch["text"], padding="max_length", truncation=True, max_length=64)


rows = rows.map(tokenize, batched=True).rename_column("label", "labels")
rows = rows.with_format("torch", columns=["input_ids", "attention_mask", "labels"])
loader = torch.utils.data.DataLoader(rows, batch_size=n)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
model.train()
step = 0
while step < steps:
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"loss {loss.item():.4f}")
        step += 1
        if step == steps:
            break
