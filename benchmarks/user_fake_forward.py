"""The floor for the simulated scans (bench_simulate_scale.py): the fake forward a user writes by
hand to check a big model's shapes and dtypes without its weights, doing the work the scan does.
Import datasets and transformers, read the first rows of DATA's train split and tokenize them
with the model's tokenizer (truncation, then padded into a batch with labels, as a causal LM's
collator does), build the model from its config under PyTorch's FakeTensorMode in bfloat16
(transformers' own weight initialisation included, as `from_config` does it), run one forward.

    python benchmarks/user_fake_forward.py MODEL_DIR DATA [ROWS]
"""

import sys

import datasets
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling

model_dir, data = sys.argv[1], sys.argv[2]
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 2
tokenizer = AutoTokenizer.from_pretrained(model_dir)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token
split = datasets.load_from_disk(data)["train"].select(range(rows))
encoded = split.map(lambda b: tokenizer(b["text"], truncation=True), batched=True, remove_columns=split.column_names)
batch = DataCollatorForLanguageModeling(tokenizer, mlm=False)([encoded[i] for i in range(rows)])
config = AutoConfig.from_pretrained(model_dir)
with FakeTensorMode() as mode:
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    inputs = {k: mode.from_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        out = model(**inputs)
print(f"{type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e9:.1f} B parameters, "
      f"logits {tuple(out.logits.shape)} {out.logits.dtype}, loss {out.loss.dtype}")
