"""fp8 training with torchao: convert_to_float8_training on a 32→48→40→16 MLP (48→40's N and
40→16's K are not multiples of 16: CUDA's fp8 matmul refuses them), two AdamW steps."""

import sys

import torch
import torch.nn as nn
from torchao.float8 import convert_to_float8_training

torch.manual_seed(0)
device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 16)).to(device)
convert_to_float8_training(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 32, device=device)
for step in range(2):
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", loss.item())
