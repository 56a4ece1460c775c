"""One mixed-precision training step with GradScaler (fp16 to save memory)."""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model_dir, data_dir = sys.argv[1], sys.argv[2]
device = "cpu"
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSequenceClassification.from_pretrained(model_dir)
model.half()
model.to(device)
model.train()

rows = load_from_disk(data_dir)["train"].select(range(4))
batch = tokenizer(list(rows["text"]), padding=True, return_tensors="pt")
batch["labels"] = torch.tensor(list(rows["label"]))

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler(device)

with torch.autocast(device_type=device, dtype=torch.float16):
    outputs = model(**batch)
    loss = outputs.loss
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
print("loss", loss.item())
