"""A tiny Llama (from its config, no download) generating NEW tokens greedily, placed the way model
cards write it (`model.to(0)` where CUDA is there). Prints the loop's own time:
`generated (1, 28) cuda:0 0.84s`.

    python benchmarks/user_generate.py [NEW]
"""

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

new = int(sys.argv[1]) if len(sys.argv) > 1 else 20
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128)
model = LlamaForCausalLM(config).eval()
cuda = torch.cuda.is_available()
model.to(0 if cuda else "cpu")
ids = torch.randint(0, 128, (1, 8)).to(model.device)
start = time.perf_counter()
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
print("generated", tuple(out.shape), out.device, f"{time.perf_counter() - start:.3f}s", file=sys.stderr)
