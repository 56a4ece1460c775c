"""A Trainer script: a tiny causal LM loaded with dtype=torch.float16 "to save memory", trained with
Trainer(fp16=True) where there is a GPU. The fp16-loaded weights under fp16 AMP are the classic
mistake ("Attempting to unscale FP16 gradients"); `--fp32` loads the weights in float32 instead.
"""

import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model_dir, out_dir = sys.argv[1], sys.argv[2]
dtype = torch.float32 if "--fp32" in sys.argv else torch.float16
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)

ids = torch.randint(0, model.config.vocab_size, (8, 12)).tolist()
train = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 12] * 8, "labels": ids})
args = TrainingArguments(
    output_dir=out_dir, per_device_train_batch_size=4, max_steps=2, logging_steps=1, report_to=[],
    fp16=torch.cuda.is_available(), save_strategy="no", use_cpu=not torch.cuda.is_available(),
)
trainer = Trainer(model=model, args=args, train_dataset=train)
trainer.train()
print("trained", trainer.state.global_step, "steps")
