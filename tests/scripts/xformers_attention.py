import sys
import torch
import xformers.ops as xops

dtype = getattr(torch, sys.argv[1])
lin = torch.nn.Linear(16, 16).cuda().to(dtype)
x = torch.randn(2, 8, 16, device="cuda", dtype=dtype)
q = lin(x).view(2, 8, 2, 8)
out = xops.memory_efficient_attention(q, q, q, attn_bias=xops.LowerTriangularMask())
out.float().sum().backward()
print("ok", tuple(out.shape))
