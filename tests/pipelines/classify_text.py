"""Score a text classifier's loss on a few rows."""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification

from prep_labels import preprocess

model_dir, data_dir = sys.argv[1], sys.argv[2]
model = AutoModelForSequenceClassification.from_pretrained(model_dir)

dataset = load_from_disk(data_dir)["train"]
dataset.set_transform(preprocess)
batch = dataset[:4]

with torch.no_grad():
    outputs = model(**batch)
print("loss", outputs.loss.item())
