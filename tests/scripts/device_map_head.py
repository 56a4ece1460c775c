"""A causal LM spread over the GPUs with `device_map="auto"`, and the script's own classification
head on the first GPU, trained together: `python device_map_head.py MODEL_DIR [moved|left]`.

`moved` brings the last hidden state to the head's device (`hidden.to(head.weight.device)`), as
accelerate's docs tell you to; `left` forgets it, and on a machine whose last layer sits on
another GPU than cuda:0 the head's matmul refuses the two devices.
"""

import sys

import torch
from transformers import AutoModel

model_dir, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "moved")
# A first GPU too small for a layer: the model lands on the second one, the head stays on the first.
model = AutoModel.from_pretrained(model_dir, device_map="auto", max_memory={0: "60KiB", 1: "10GiB"})
head = torch.nn.Linear(model.config.hidden_size, 2).to("cuda:0")
optimizer = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
ids = torch.randint(5, 100, (2, 8)).to(model.device)
labels = torch.tensor([0, 1], device="cuda:0")
for step in range(2):
    hidden = model(input_ids=ids).last_hidden_state[:, -1]
    if mode == "moved":
        hidden = hidden.to(head.weight.device)
    loss = torch.nn.functional.cross_entropy(head(hidden), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print("step", step, "hidden on", hidden.device, "head on", head.weight.device)
