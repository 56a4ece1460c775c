"""Tokenize and build labels for a text classifier (used with set_transform)."""

import os

import torch
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(os.environ.get("MODEL_DIR", "fixtures/models/bert-tiny"))


def preprocess(batch):
    enc = tokenizer(batch["text"], padding="max_length", truncation=True, max_length=24, return_tensors="pt")
    enc["labels"] = torch.tensor(batch["label"], dtype=torch.int32)
    return enc
