"""One training step of a causal LM loaded with attn_implementation="flash_attention_2", as TRL's and
transformers' fine-tuning scripts load it (trl/scripts/sft.py: ModelConfig.attn_implementation passed to
from_pretrained with dtype). python flash_attn_train.py MODEL_DIR bfloat16|float16|float32
"""

import sys

import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=getattr(torch, sys.argv[2]),
                                             attn_implementation="flash_attention_2").to("cuda")
ids = torch.randint(5, 100, (2, 8), device="cuda")
out = model(input_ids=ids, labels=ids)
out.loss.backward()
print("trained one step")
