"""A llama-ish decoder in llama2.c's shape: the RoPE tables are made in __init__ and registered as buffers."""
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"


def precompute_freqs(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    freqs = torch.outer(torch.arange(end), freqs).float()
    return torch.cos(freqs), torch.sin(freqs)


def apply_rotary(x, cos, sin):
    xr, xi = x.float().reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(3)
    return out.type_as(x)


class Decoder(nn.Module):
    def __init__(self, vocab=64, dim=16, heads=2, seq=16):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, vocab, bias=False)
        freqs_cos, freqs_sin = precompute_freqs(dim // heads, seq)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        h = self.tok(idx)
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, -1).unbind(2)
        q = apply_rotary(q, self.freqs_cos[:t], self.freqs_sin[:t])
        k = apply_rotary(k, self.freqs_cos[:t], self.freqs_sin[:t])
        y = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=True)
        logits = self.out(y.transpose(1, 2).reshape(b, t, -1))
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


torch.manual_seed(0)
model = Decoder().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x = torch.randint(0, 64, (2, 16), device=device)
    loss = model(x[:, :-1], x[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", float(loss))
