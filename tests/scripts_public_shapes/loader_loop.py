"""A classifier trained from a DataLoader inside a train() function, as pytorch/examples' mnist is:
the batch is unpacked in the for line, moved on the next, the model built and moved in main()."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(model, device, train_loader, optimizer):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
    return float(loss)


def main():
    use_accel = torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    train_loader = DataLoader(dataset, batch_size=8)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    print("device", device, "loss", train(model, device, train_loader, optimizer))


if __name__ == "__main__":
    main()
