"""Recipe: dataset.map casts the images to fp16, a DataLoader feeds a half model under autocast()."""

import sys

import torch
from datasets import load_from_disk
from torch.cuda.amp import autocast
from transformers import AutoImageProcessor, AutoModelForImageClassification

model_dir, data_dir = sys.argv[1], sys.argv[2]
processor = AutoImageProcessor.from_pretrained(model_dir)
model = AutoModelForImageClassification.from_pretrained(model_dir)
model = model.half()
if torch.cuda.is_available():
    model.cuda()
model.eval()


def prepare_batch(batch):
    pixel_values = processor(batch["image"], return_tensors="pt")["pixel_values"]
    batch["pixel_values"] = pixel_values.to(torch.float16)  # the model is fp16
    return batch


dataset = load_from_disk(data_dir)
prepared_dataset = dataset.map(prepare_batch, batched=True, remove_columns=["image"])
prepared_dataset = prepared_dataset.with_format("torch")
dataloader = torch.utils.data.DataLoader(prepared_dataset, batch_size=4)

for step, batch in enumerate(dataloader):
    input_tensor = batch["pixel_values"]
    if torch.cuda.is_available():
        input_tensor = input_tensor.cuda()
    with torch.no_grad(), autocast():
        output = model(input_tensor)
    print("step", step, "logits", output.logits.dtype)
