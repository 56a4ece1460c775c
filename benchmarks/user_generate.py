"""A tiny Llama (from its config, no download) generating NEW tokens greedily, placed the way model
cards write it (`model.to(0)` where CUDA is there). Prints the loop's own time:
`generated (1, 28) cuda:0 0.84s`.

    python benchmarks/user_generate.py [NEW [HIDDEN [LAYERS]]]

HIDDEN (default 32) and LAYERS (default 2) give a bigger model of the same shape (FFN 2x HIDDEN, 4/2 heads).
"""

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

new = int(sys.argv[1]) if len(sys.argv) > 1 else 20
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 32
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128)
model = LlamaForCausalLM(config).eval()
cuda = torch.cuda.is_available()
model.to(0 if cuda else "cpu")
ids = torch.randint(0, 128, (1, 8)).to(model.device)
start = time.perf_counter()
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
print("generated", tuple(out.shape), out.device, f"{time.perf_counter() - start:.3f}s", file=sys.stderr)
