"""Recipe: an AMP training loop with autocast and GradScaler over a DataLoader, custom model and loss."""

import sys

import torch
from torch import nn

num_epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.body(x)


features = torch.randn(16, 16)
labels = torch.randint(0, 3, (16,)).to(torch.int32)  # ids stored compactly
dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels), batch_size=4)

model = MyModel().to(device)
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.cuda.amp.GradScaler()  # Enables AMP

for epoch in range(num_epochs):
    for step, (batch, target) in enumerate(dataloader):
        batch, target = batch.to(device), target.to(device)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():  # Enables autocasting to FP16
            outputs = model(batch)
            loss = loss_fn(outputs, target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
