"""Trains the llama-style Transformer on random tokens, then saves its state_dict."""
import argparse

import torch
import torch.nn.functional as F

from model import Transformer

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()
torch.manual_seed(0)
model = Transformer().to(args.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    tokens = torch.randint(0, 64, (2, 17), device=args.device)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f}")
torch.save(model.state_dict(), "ckpt.pt")
