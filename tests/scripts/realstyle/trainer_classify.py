"""Fine-tune a sequence classifier with the Trainer, as the transformers text-classification examples
do: tokenize with datasets.map, TrainingArguments(fp16=...) where there is a GPU, Trainer.train().

    python trainer_classify.py MODEL_DIR DATA_DIR OUTPUT_DIR
"""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

model_dir, data_dir, output_dir = sys.argv[1:4]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForSequenceClassification.from_pretrained(model_dir)

raw = load_from_disk(data_dir)
tokenized = raw.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=32), batched=True, remove_columns=["text"])

args = TrainingArguments(
    output_dir=output_dir,
    per_device_train_batch_size=4,
    max_steps=2,
    learning_rate=5e-5,
    logging_steps=1,
    report_to=[],
    save_strategy="no",
    fp16=torch.cuda.is_available(),
    use_cpu=not torch.cuda.is_available(),
)
trainer = Trainer(
    model=model, args=args, train_dataset=tokenized["train"], data_collator=DataCollatorWithPadding(tokenizer),
)
trainer.train()
print("trained", trainer.state.global_step, "steps")
