"""Sampling from a small language model in nanoGPT's sample.py shape: the model is built in an if/elif, set to
eval and moved to the device; the prompt is made on the device (`torch.tensor(ids, device=device)`); the
model's own generate() calls its forward and samples with torch.multinomial."""
import torch
import torch.nn as nn
import torch.nn.functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
init_from = "scratch"


class TinyLM(nn.Module):
    def __init__(self, vocab=16, dim=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        return self.head(torch.tanh(self.wte(idx)))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens):
        for _ in range(max_new_tokens):
            probs = F.softmax(self(idx)[:, -1, :], dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


torch.manual_seed(1337)
if init_from == "scratch":
    model = TinyLM()
elif init_from == "small":
    model = TinyLM(dim=4)

model.eval()
model.to(device)

start_ids = [1, 2, 3]
x = (torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...])
y = model.generate(x, 6)
print(y[0].tolist())
