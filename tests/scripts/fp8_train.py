"""fp8 training as a user writes it without torchao: an fp8 Linear of their own on torch._scaled_mm
(forward and backward, e4m3 activations and weights, e5m2 gradients), swapped in by a conversion
function shaped like torchao's convert_to_float8_training (a module_filter_fn(module, fqn))."""

import sys

import torch
import torch.nn as nn

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


class _Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        one = torch.ones((), device=x.device)
        return torch._scaled_mm(x.to(E4), w.to(E4).t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        one = torch.ones((), device=grad.device)
        g = grad.to(E5)
        grad_x = torch._scaled_mm(g, w.to(E4).t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        grad_w = torch._scaled_mm(g.t().contiguous(), x.to(E4).t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return grad_x.to(x.dtype), grad_w.to(w.dtype)


class Float8Linear(nn.Linear):
    """An nn.Linear that keeps its float32 weight, multiplies in fp8 and returns the input's dtype (as torchao's)."""

    def forward(self, x):
        out = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight).to(x.dtype)
        return out + self.bias if self.bias is not None else out


def swap_to_float8(model, module_filter_fn=None):
    """Every nn.Linear the filter accepts becomes a Float8Linear (same weight), as torchao converts."""
    for fqn, mod in list(model.named_modules()):
        if type(mod) is nn.Linear and (module_filter_fn is None or module_filter_fn(mod, fqn)):
            parent, _, leaf = fqn.rpartition(".")
            new = Float8Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device=mod.weight.device)
            new.weight, new.bias = mod.weight, mod.bias
            setattr(model.get_submodule(parent) if parent else model, leaf, new)
    return model


torch.manual_seed(0)
device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 16)).to(device)
swap_to_float8(model, module_filter_fn=lambda mod, fqn: mod.in_features >= 16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 32, device=device)
for step in range(2):
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done", loss.item())
