"""The floors under any loop on stand-ins: a greedy decoding loop written by hand (the model called
with its cache, the next token by argmax), on the real CPU or on stand-ins with nothing of the
doctor's:

- `--meta`: the model and its inputs on PyTorch's `meta` device (no Python mode at all: the least
  any data-less tensor costs);
- `--meta --modes`: that under one no-op TorchFunctionMode and one no-op TorchDispatchMode (the least
  a tool that sees every op costs, before it records anything);
- `--fake`: PyTorch's own FakeTensorMode.

bench_simulated_generate.py --torch-floor runs each beside the CPU loop. `generate()` cannot be the
floors' loop: its stopping check reads a value, which plain meta and fake tensors refuse.

    python benchmarks/user_greedy_loop.py [--meta [--modes] | --fake] [NEW [HIDDEN [LAYERS]]]

Prints the loop's own time, as user_generate.py does: `generated (1, 28) cpu 0.41s`.
"""

import contextlib
import sys
import time

import torch
from floor_generate import _NoOpDispatch, _NoOpFunction  # the same no-op modes as the generate floors
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

FLAGS = ("--meta", "--modes", "--fake")
flags = {a for a in sys.argv[1:] if a in FLAGS}
rest = [a for a in sys.argv[1:] if a not in FLAGS]
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
    with contextlib.ExitStack() as stack:
        if "--modes" in flags:
            stack.enter_context(_NoOpFunction())
            stack.enter_context(_NoOpDispatch())
        start = time.perf_counter()
        with torch.no_grad():
            for _ in range(new):
                logits = model(input_ids=step, cache=cache, use_cache=True).logits
                step = logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, step], -1)
        return ids, time.perf_counter() - start


with contextlib.ExitStack() as where:
    if "--meta" in flags:
        where.enter_context(torch.device("meta"))
    elif "--fake" in flags:
        from torch._subclasses.fake_tensor import FakeTensorMode

        where.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
    out, took = loop()
print("generated", tuple(out.shape), out.device, f"{took:.3f}s", file=sys.stderr)
