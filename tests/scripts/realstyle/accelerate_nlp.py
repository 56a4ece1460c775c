"""Fine-tune a sequence classifier with accelerate, in the style of accelerate's examples/nlp_example.py:
tokenize with datasets.map, rename label → labels, pad in collate_fn, Accelerator(mixed_precision=...)
prepares model, optimizer, dataloaders and scheduler, accelerator.backward() scales the loss.

    python accelerate_nlp.py MODEL_DIR DATA_DIR [--mixed_precision fp16|bf16|no]
"""

import argparse

import torch
from datasets import load_from_disk
from torch.optim import AdamW
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup, set_seed

from accelerate import Accelerator


def get_dataloaders(accelerator, model_dir, data_dir, batch_size=4):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    datasets = load_from_disk(data_dir)

    def tokenize_function(examples):
        return tokenizer(examples["text"], truncation=True, max_length=32)

    with accelerator.main_process_first():
        tokenized_datasets = datasets.map(tokenize_function, batched=True, remove_columns=["text"])
    tokenized_datasets = tokenized_datasets.rename_column("label", "labels")

    def collate_fn(examples):
        pad_to_multiple_of = 8 if accelerator.mixed_precision != "no" else None
        return tokenizer.pad(examples, padding="longest", pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")

    train_dataloader = DataLoader(tokenized_datasets["train"], shuffle=True, collate_fn=collate_fn, batch_size=batch_size, drop_last=True)
    eval_dataloader = DataLoader(tokenized_datasets["test"], shuffle=False, collate_fn=collate_fn, batch_size=batch_size)
    return train_dataloader, eval_dataloader


def training_function(config, args):
    mixed_precision = args.mixed_precision or ("fp16" if torch.cuda.is_available() else "no")
    accelerator = Accelerator(mixed_precision=mixed_precision)
    set_seed(config["seed"])
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, args.model_dir, args.data_dir, config["batch_size"])
    model = AutoModelForSequenceClassification.from_pretrained(args.model_dir, return_dict=True)
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=config["lr"])
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer, num_warmup_steps=1, num_training_steps=len(train_dataloader) * config["num_epochs"],
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    for epoch in range(config["num_epochs"]):
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = 0
        for batch in eval_dataloader:
            batch.to(accelerator.device)
            with torch.no_grad():
                outputs = model(**batch)
            correct += (outputs.logits.argmax(dim=-1) == batch["labels"]).sum().item()
        accelerator.print(f"epoch {epoch}: accuracy {correct / len(eval_dataloader.dataset):.2f}")
    accelerator.end_training()


def main():
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    parser.add_argument("model_dir")
    parser.add_argument("data_dir")
    parser.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"])
    args = parser.parse_args()
    config = {"lr": 2e-5, "num_epochs": 1, "seed": 42, "batch_size": 4}
    training_function(config, args)


if __name__ == "__main__":
    main()
