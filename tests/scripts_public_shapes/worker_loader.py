"""A loop over a DataLoader with a worker process and pinned memory, as mnist_rnn runs with --accel."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    loader = DataLoader(ds, batch_size=8, num_workers=1, pin_memory=True)
    model = nn.Linear(8, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
    print("loss", float(loss))
