"""A trainer class in minGPT's shape: the batch is a list, moved with a comprehension over its tensors."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Pairs(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 10, (6,), generator=g)
        return x, (x + 1) % 10


class Trainer:
    def __init__(self, model, dataset):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = model.to(self.device)
        self.loader = DataLoader(dataset, batch_size=4)

    def run(self, max_iters=3):
        opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        data_iter = iter(self.loader)
        for _ in range(max_iters):
            batch = next(data_iter)
            batch = [t.to(self.device) for t in batch]
            x, y = batch
            logits = self.model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 10), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss)


model = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 10))
print("loss", Trainer(model, Pairs()).run())
