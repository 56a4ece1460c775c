"""Fit a polynomial with one Linear layer: the data is made by the script's own functions (features,
a target function with fixed weights) before the model is ever called (pytorch/examples' regression)."""
import numpy as np
import torch
import torch.nn.functional as F

DEGREE = 3
torch.manual_seed(0)
W_true = torch.randn(DEGREE, 1)
b_true = torch.randn(1)


def features(x):
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, DEGREE + 1)], 1)


def target(x):
    return x.mm(W_true) + b_true.item()


def batch(size=16):
    points = torch.from_numpy(np.random.rand(size).astype(np.float32))
    x = features(points)
    return x, target(x)


model = torch.nn.Linear(DEGREE, 1)
for step in range(3):
    x, y = batch()
    model.zero_grad()
    loss = F.smooth_l1_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.data.add_(-0.1 * p.grad)
print(f"loss {loss.item():.4f}")
