"""A tiny Stable Diffusion pipeline (built from configs, no download) generating one image in
STEPS denoising steps: one pipeline call, the UNet called STEPS times (twice per step's batch under
classifier-free guidance, as one batched call), the text encoder twice, the VAE once. Prints
`image (1, 3, 64, 64) 1.23s` on stderr.

    python benchmarks/user_pipeline_loop.py [STEPS]
"""

import sys
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
tokenizer = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures/models/llama-tiny")
tokenizer.model_max_length = 16
torch.manual_seed(0)
text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16,
                                            pad_token_id=tokenizer.pad_token_id, bos_token_id=1, eos_token_id=2))
unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                            attention_head_dim=2, norm_num_groups=4)
vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                    layers_per_block=1, norm_num_groups=4, sample_size=16)
pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                               scheduler=DDIMScheduler(clip_sample=False), safety_checker=None, feature_extractor=None,
                               requires_safety_checker=False)
del vae, text_encoder, unet  # the pipeline holds its components, as from_pretrained's would
pipe.set_progress_bar_config(disable=True)
start = time.perf_counter()
image = pipe("a cat", num_inference_steps=steps, height=64, width=64, output_type="pt").images
print("image", tuple(image.shape), f"{time.perf_counter() - start:.2f}s", file=sys.stderr)
