"""Train the small GPT of model.py in the style of nanoGPT's train.py: globals as the config,
`--key=value` overrides, memmap batches pinned and moved with non_blocking, an autocast context,
a GradScaler enabled for float16, gradient accumulation and clipping, estimate_loss() first."""

import math
import os
import sys
from contextlib import nullcontext

import numpy as np
import torch

from model import GPT, GPTConfig

# config (tiny)
data_dir = "data"
max_iters = 2
eval_interval = 100
eval_iters = 2
batch_size = 2
block_size = 8
gradient_accumulation_steps = 2
learning_rate = 6e-4
grad_clip = 1.0
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
for arg in sys.argv[1:]:  # poor man's configurator: --key=value
    key, value = arg[2:].split("=", 1)
    globals()[key] = type(globals()[key])(value) if not isinstance(globals()[key], str) else value

torch.manual_seed(1337)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = GPT(GPTConfig(block_size=block_size))
model.to(device)
print(f"number of parameters: {model.get_num_params()}")
scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), device_type)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    return learning_rate * 0.5 * (1.0 + math.cos(math.pi * it / max_iters))


X, Y = get_batch("train")
iter_num = 0
while True:
    for param_group in optimizer.param_groups:
        param_group["lr"] = get_lr(iter_num)
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}")
    iter_num += 1
    if iter_num > max_iters:
        break
