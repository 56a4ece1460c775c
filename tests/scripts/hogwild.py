"""pytorch/examples' mnist_hogwild shape: the script's own `mp.Process` children (spawn) train the shared
model, each with a DataLoader that pins its batches (a worker and the pin thread); the parent evaluates
after `join`. A child asserts it sees the parent's machine; the parent asserts each child ended cleanly."""

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def pick() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def train(rank, model, device, dataset, seen):
    assert (str(pick()), str(next(model.parameters()).device)) == seen, ((str(pick()), next(model.parameters()).device), seen)
    loader = DataLoader(dataset, batch_size=4, num_workers=1, pin_memory=device.type != "cpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x.to(device))
        nn.functional.cross_entropy(out, y.to(device)).backward()
        optimizer.step()
        assert out.device == next(model.parameters()).device, out.device
        break


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    device = pick()
    model = nn.Linear(8, 3).to(device)
    model.share_memory()
    data = TensorDataset(torch.randn(8, 8), torch.zeros(8, dtype=torch.long))
    seen = (str(device), str(next(model.parameters()).device))
    processes = [mp.Process(target=train, args=(rank, model, device, data, seen)) for rank in range(1)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert [p.exitcode for p in processes] == [0], [p.exitcode for p in processes]
    with torch.no_grad():
        model(torch.randn(2, 8, device=device))
