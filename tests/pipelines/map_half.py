"""Half-precision inference: the model and the preprocessed images both in float16."""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoImageProcessor, AutoModelForImageClassification

model_dir, data_dir = sys.argv[1], sys.argv[2]
processor = AutoImageProcessor.from_pretrained(model_dir)
model = AutoModelForImageClassification.from_pretrained(model_dir, dtype=torch.float16)
model.eval()


def to_half(example):
    pixel_values = processor(example["image"], return_tensors="pt")["pixel_values"][0]
    return {"pixel_values": pixel_values.half(), "labels": example["label"]}


dataset = load_from_disk(data_dir).map(to_half, remove_columns=["image", "label"])
dataset = dataset.with_format("torch")
batch = dataset[:4]

with torch.no_grad():
    outputs = model(**batch)
print("loss", outputs.loss.item())
