"""An accelerate training loop as its examples write it: Accelerator(mixed_precision="fp16")
prepares the model, optimizer and DataLoader, accelerator.backward() scales the loss, the
prepared optimizer steps through its GradScaler. Mistakes the tests inject:
    --half          model.half() before prepare (half weights under the fp16 GradScaler)
    --int32-labels  class ids stored as int32
"""

import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

flags = set(sys.argv[1:])
accelerator = Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no")
torch.manual_seed(0)

features = torch.randn(16, 12)
labels = torch.randint(0, 4, (16,)).to(torch.int32 if "--int32-labels" in flags else torch.int64)
loader = DataLoader(TensorDataset(features, labels), batch_size=4, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
if "--half" in flags:
    model.half()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

model.train()
for epoch in range(2):
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 2 == 0:
            accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
