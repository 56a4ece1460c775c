"""A tiny Stable Diffusion pipeline built from its components' configs (no download): a CLIP text
encoder on the llama-tiny tokenizer, a two-block UNet, a two-block VAE, DDIM. Random weights
(seeded): the tests are about dtypes and ranges, not pictures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def tiny_sd_pipeline() -> Any:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel

    tokenizer = AutoTokenizer.from_pretrained(FIX / "models/llama-tiny")
    tokenizer.model_max_length = 16
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                                num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16,
                                                pad_token_id=tokenizer.pad_token_id, bos_token_id=1, eos_token_id=2))
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                attention_head_dim=2, norm_num_groups=4)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                        layers_per_block=1, norm_num_groups=4, sample_size=16)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=DDIMScheduler(clip_sample=False), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def saved_sd_pipeline(folder: Path, *, hot_vae: bool = False) -> Path:
    """tiny_sd_pipeline saved with save_pretrained (safetensors) into `folder`; `hot_vae`: a decoder whose
    first conv reaches ~1.5e5 in fp32, as a full-size SDXL VAE's activations do (fine in fp32, NaN in fp16)."""
    pipe = tiny_sd_pipeline()
    if hot_vae:
        with torch.no_grad():
            pipe.vae.decoder.conv_in.weight.mul_(2e4)
            pipe.vae.decoder.conv_in.bias.mul_(2e4)
    pipe.save_pretrained(folder)
    return folder
