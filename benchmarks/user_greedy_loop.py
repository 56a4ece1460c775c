"""The floor of any loop on stand-ins: a greedy decoding loop written by hand (the model called
with its cache, the next token by argmax), on the real CPU or under PyTorch's own FakeTensorMode,
with nothing of the doctor's. The ratio of the two is what PyTorch's fake tensors alone cost a
loop of this size (bench_simulated_generate.py --torch-floor). `generate()` cannot be the floor's
loop: its stopping check reads a value, which plain fake tensors refuse.

    python benchmarks/user_greedy_loop.py [--fake] [NEW [HIDDEN [LAYERS]]]

Prints the loop's own time, as user_generate.py does: `generated (1, 28) cpu 0.41s`.
"""

import sys
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

fake = "--fake" in sys.argv[1:]
rest = [a for a in sys.argv[1:] if a != "--fake"]
new = int(rest[0]) if rest else 20
hidden = int(rest[1]) if len(rest) > 1 else 32
layers = int(rest[2]) if len(rest) > 2 else 2
config = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128)


def loop() -> tuple[torch.Tensor, float]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 8))
    cache, step = DynamicCache(config=config), ids
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(new):
            logits = model(input_ids=step, cache=cache, use_cache=True).logits
            step = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, step], -1)
    return ids, time.perf_counter() - start


if fake:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        out, took = loop()
else:
    out, took = loop()
print("generated", tuple(out.shape), out.device, f"{took:.3f}s", file=sys.stderr)
