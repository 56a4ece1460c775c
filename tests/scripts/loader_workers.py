"""A training loop that loads its data in worker processes, in the shape of pytorch/examples mnist/main.py.

mnist/main.py:107-112 passes {'num_workers': 1, 'pin_memory': True, 'shuffle': True} to its DataLoaders when
an accelerator is there, and its train() moves each batch with data.to(device) (main.py:39). Here two workers,
the start method and persistence from the command line: python loader_workers.py fork|spawn|forkserver [persistent]
[unpicklable] [hang]; "unpicklable" puts a lock in each sample, which no worker can send to the main process;
"hang" makes worker 0's __getitem__ block (a read from a mount that stopped answering), so its batch never comes.
"""

import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

with open("started.log", "a") as log:  # the top level: a spawned worker imports the script again and runs it
    log.write(f"{__name__}\n")


class Rows(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        row = {"x": torch.full((8,), float(i)), "y": i % 4}
        if "unpicklable" in sys.argv:
            row["lock"] = threading.Lock()
        if "hang" in sys.argv and get_worker_info().id == 0:
            time.sleep(600)
        return row


def collate(rows):
    return torch.stack([r["x"] for r in rows]), torch.tensor([r["y"] for r in rows]), [r["lock"] for r in rows if "lock" in r]


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Rows(), batch_size=4, shuffle=True, num_workers=2, pin_memory=True, collate_fn=collate,
                        multiprocessing_context=sys.argv[1], persistent_workers="persistent" in sys.argv)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for data, target, _locks in loader:
        print("batch from the workers:", data.device.type, data.dtype, "pinned" if data.is_pinned() else "pageable")
        data, target = data.to(device), target.to(device)
        print("step on", data.device)
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        break


if __name__ == "__main__":
    main()
