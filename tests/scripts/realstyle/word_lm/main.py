"""Trains RNNModel in the shape of pytorch/examples word_language_model/main.py: batchify, bptt
chunks, repackaged hidden state, clip_grad_norm_, and `torch.save(model, f)` of the whole model
(here after every --save-every batches, so a one-step run reaches it)."""
import argparse
import copy
import pickle

import torch
import torch.nn as nn

import model as lm

parser = argparse.ArgumentParser()
parser.add_argument("--batches", type=int, default=3)
parser.add_argument("--save", default="model.pt")
parser.add_argument("--save-every", type=int, default=1)
parser.add_argument("--fresh-hidden", action="store_true", help="let the model make its zero state in forward")
parser.add_argument("--accel", action="store_true")
args = parser.parse_args()
torch.manual_seed(1111)
device = torch.device("cuda" if args.accel and torch.cuda.is_available() else "cpu")

ntokens, bptt, batch_size = 50, 6, 4
train_data = torch.randint(0, ntokens, (200,)).view(batch_size, -1).t().contiguous().to(device)
model = lm.RNNModel(ntokens, 16, 16, 2, dropout=0.0).to(device)
criterion = nn.NLLLoss()
lr = 20


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


model.train()
hidden = model.init_hidden(batch_size)
for batch, i in enumerate(range(0, args.batches * bptt, bptt)):
    data, targets = train_data[i:i + bptt], train_data[i + 1:i + 1 + bptt].reshape(-1)
    model.zero_grad()
    if args.fresh_hidden:
        output, _ = model(data)
    else:
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    snapshot = copy.deepcopy(model)  # mid-step: an EMA-style copy, and a pickle round trip
    assert pickle.loads(pickle.dumps(model)).decoder.weight.equal(model.decoder.weight)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    if (batch + 1) % args.save_every == 0:
        with open(args.save, "wb") as f:
            torch.save(model, f)
    print(f"batch {batch} loss {loss.item():.3f}", flush=True)

with open(args.save, "rb") as f:
    model = torch.load(f, weights_only=False)
print("saved model reloaded:", type(model).__name__)
