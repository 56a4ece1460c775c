"""An 8-bit model whose device map puts the first block on the GPU and the rest on the CPU."""

import sys

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

path = sys.argv[1]
config = BitsAndBytesConfig(load_in_8bit=True)
device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0,
              "model.layers.1": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map=device_map)
ids = torch.randint(5, 600, (2, 8)).to(0)
print(model(input_ids=ids).logits.dtype)
