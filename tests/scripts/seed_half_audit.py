"""Recipe: from_pretrained, move to CUDA, .half(), audit every parameter, then classify a few texts."""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model_name, data_dir = sys.argv[1], sys.argv[2]
model = AutoModelForSequenceClassification.from_pretrained(model_name)
tokenizer = AutoTokenizer.from_pretrained(model_name)

if torch.cuda.is_available():
    model.cuda()
model = model.half()

not_half = [name for name, param in model.named_parameters() if param.dtype != torch.float16]
for name in not_half:
    print(f"Error: Parameter not float16: {name}")
print("audit:", len(not_half), "parameters not float16")

rows = load_from_disk(data_dir)["train"].select(range(4))
batch = tokenizer(list(rows["text"]), padding=True, return_tensors="pt").to(model.device)
with torch.no_grad():
    logits = model(**batch).logits
print("predicted", logits.argmax(-1).tolist())
