"""The floor for the simulated scans (bench_simulate_scale.py): the fake forward a user writes by
hand to check a big model's shapes and dtypes without its weights. Import transformers, build
the model from its config under PyTorch's FakeTensorMode in bfloat16 (transformers' own weight
initialisation included, as `from_config` does it), run one forward on two rows.

    python benchmarks/user_fake_forward.py MODEL_DIR [SEQ_LEN]
"""

import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoConfig, AutoModelForCausalLM

model_dir = sys.argv[1]
seq = int(sys.argv[2]) if len(sys.argv) > 2 else 16
config = AutoConfig.from_pretrained(model_dir)
with FakeTensorMode():
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    ids = torch.ones(2, seq, dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
print(f"{type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e9:.1f} B parameters, logits {tuple(logits.shape)} {logits.dtype}")
