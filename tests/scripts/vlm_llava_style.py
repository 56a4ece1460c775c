"""A LLaVA-style model of the user's own (a ViT patch embedding, a projector, a Llama) fed by LLaVA's
real processor, written as InternVL's and DeepSeek-VL's remote code is (a PreTrainedModel whose
vision tower takes pixel_values as they come). The model is bf16, the processor's pixel_values
float32: plain python dies in the patch convolution.

    python vlm_llava_style.py MODEL_DIR DATA_DIR      # fixtures/models/llava-tiny fixtures/data/image-text
"""

import sys

import torch
from datasets import load_from_disk
from transformers import AutoConfig, AutoProcessor, LlamaForCausalLM, LlavaConfig, PreTrainedModel

model_dir, data_dir = sys.argv[1], sys.argv[2]


class VisionTower(torch.nn.Module):
    def __init__(self, width: int = 32, patch: int = 8) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, width, kernel_size=patch, stride=patch)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.norm(self.patch(pixel_values).flatten(2).transpose(1, 2))


class TinyVLM(PreTrainedModel):
    config_class = LlavaConfig

    def __init__(self, config: LlavaConfig) -> None:
        super().__init__(config)
        self.vision = VisionTower()
        self.lm = LlamaForCausalLM(config.text_config)
        self.projector = torch.nn.Linear(32, config.text_config.hidden_size)
        self.image_token_id = config.image_token_id
        self.post_init()

    def forward(self, input_ids, attention_mask, pixel_values):
        image = self.projector(self.vision(pixel_values))
        embeds = self.lm.get_input_embeddings()(input_ids)
        slots = (input_ids == self.image_token_id).unsqueeze(-1)
        embeds = embeds.masked_scatter(slots, image.to(embeds.dtype))
        return self.lm(inputs_embeds=embeds, attention_mask=attention_mask)


processor = AutoProcessor.from_pretrained(model_dir)
config = AutoConfig.from_pretrained(model_dir)
torch.manual_seed(0)
model = TinyVLM(config).to(torch.bfloat16).eval()

rows = load_from_disk(data_dir).select(range(2))
inputs = processor(text=list(rows["text"]), images=list(rows["image"]), return_tensors="pt", padding=True)
with torch.no_grad():
    out = model(**inputs)
print("vlm logits", out.logits.dtype, tuple(out.logits.shape))
