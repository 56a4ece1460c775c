"""Evaluate an image classifier on a few images, with a custom transform."""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoModelForImageClassification

from prep_half import preprocess

model_dir, data_dir = sys.argv[1], sys.argv[2]
model = AutoModelForImageClassification.from_pretrained(model_dir)
model.eval()

dataset = load_from_disk(data_dir)
dataset.set_transform(preprocess)

rows = [dataset[i] for i in range(4)]
batch = {
    "pixel_values": torch.stack([r["pixel_values"] for r in rows]),
    "labels": torch.tensor([r["labels"] for r in rows]),
}
with torch.no_grad():
    outputs = model(**batch)
print("loss", outputs.loss.item())
