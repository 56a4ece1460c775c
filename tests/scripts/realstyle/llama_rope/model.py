"""A llama-style decoder in the shape of meta-llama/llama model.py: the RoPE table is a plain
attribute made in __init__ (`self.freqs_cis = precompute_freqs_cis(...)`), which `model.to(...)`
does not move; llama moves it in forward (`self.freqs_cis = self.freqs_cis.to(h.device)`)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end)
    freqs = torch.outer(t, freqs).float()
    return torch.cos(freqs), torch.sin(freqs)


def apply_rotary_emb(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class Transformer(nn.Module):
    def __init__(self, vocab_size=64, dim=32, n_layers=2, n_heads=4, max_seq_len=32):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Attention(dim, n_heads) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.freqs_cos, self.freqs_sin = precompute_freqs_cis(dim // n_heads, max_seq_len * 2)

    def forward(self, tokens, start_pos=0):
        _, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        self.freqs_cos, self.freqs_sin = self.freqs_cos.to(h.device), self.freqs_sin.to(h.device)
        cos = self.freqs_cos[start_pos: start_pos + seqlen]
        sin = self.freqs_sin[start_pos: start_pos + seqlen]
        for layer in self.layers:
            h = h + layer(h, cos, sin)
        return self.output(self.norm(h)).float()
