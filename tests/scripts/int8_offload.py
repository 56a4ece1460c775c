"""An 8-bit model too big for the machine's memory, as a user offloads it: the last block to disk.

transformers refuses this map unless BitsAndBytesConfig(llm_int8_enable_fp32_cpu_offload=True)
(DD505); with the flag, the offloaded modules load in float32 and the step runs.
"""

import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

path = sys.argv[1]
config = BitsAndBytesConfig(load_in_8bit=True)
device_map = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}
model = AutoModelForCausalLM.from_pretrained(path, quantization_config=config, device_map=device_map,
                                             offload_folder=tempfile.mkdtemp())
ids = torch.randint(5, 600, (2, 8))
print(model(input_ids=ids).logits.dtype)
