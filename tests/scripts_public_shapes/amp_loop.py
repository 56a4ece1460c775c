"""A training loop in nanoGPT's train.py shape: the precision is a string the script maps to a torch dtype,
autocast runs on CUDA only, and a GradScaler is on for float16 (`scaler.scale(loss).backward()`)."""
from contextlib import nullcontext

import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = "float16"  # 'float32', 'bfloat16', or 'float16', the latter with a GradScaler
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 16, device=device), torch.randint(0, 4, (64,), device=device)
for it in range(4):
    with ctx:
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
torch.save(model.state_dict(), "ckpt.pt")
print("loss", float(loss))
