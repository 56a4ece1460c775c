"""An 8-bit model placed by device_map="auto" on a GPU given too little memory: transformers offloads to the CPU and refuses."""

import sys

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

path = sys.argv[1]
config = BitsAndBytesConfig(load_in_8bit=True)
model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map="auto",
                                             max_memory={0: "185KB", "cpu": "1GB"})
ids = torch.randint(5, 600, (2, 8)).to(0)
print(model(input_ids=ids).logits.dtype)
