"""A QLoRA loop: a bitsandbytes 4-bit base loaded with device_map={"": device}, peft LoRA adapters
after prepare_model_for_kbit_training, autocast + GradScaler where there is a GPU. The mistake the
tests inject: `--half-adapters` casts the LoRA adapters to float16 (half trainable weights under
the fp16 GradScaler: "Attempting to unscale FP16 gradients").
"""

import sys

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

model_dir = sys.argv[1]
device = "cuda" if torch.cuda.is_available() else "cpu"
quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float16)
model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quant, device_map={"": device})
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
if "--half-adapters" in sys.argv:
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = param.data.to(torch.float16)
model.print_trainable_parameters()

optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
ids = torch.randint(0, model.config.vocab_size, (2, 12))
for step in range(2):
    batch = {"input_ids": ids.to(device), "labels": ids.to(device)}
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=device == "cuda"):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
