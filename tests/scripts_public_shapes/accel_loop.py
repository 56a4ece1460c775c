"""A plain training loop that picks its device with torch.accelerator, as current pytorch/examples do."""
import torch
import torch.nn as nn

device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
for i in range(0, 32, 8):
    data, target = x[i:i + 8].to(device), y[i:i + 8].to(device)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(data), target)
    loss.backward()
    opt.step()
print("device", device, "loss", float(loss))
