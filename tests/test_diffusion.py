"""diffusers pipelines, traced as one: each component as itself, its dtype and device in the report.

diffusers first: a tiny Stable Diffusion pipeline (tests/helpers_diffusion.py) runs in float32; its
UNet cast alone to bf16 dies with "mat1 and mat2 must have the same dtype"; in float16 a VAE whose
decoder leaves fp16's range decodes to NaN with no error. Then the doctor: every refusal named
inside its component ("unet.conv_in", not the text encoder), DD801 for the components that do not
mix, DD802 for the VAE.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from dtype_doctor.integrations.diffusion import diagnose_pipeline  # noqa: E402
from helpers_diffusion import tiny_sd_pipeline  # noqa: E402
from helpers_models import assert_same, found, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def pipe():
    return tiny_sd_pipeline()


def _run(pipe) -> np.ndarray:
    return pipe("a red circle", num_inference_steps=1, output_type="np").images


def test_float32_pipeline_is_clean_and_lists_its_components(pipe) -> None:
    assert np.isfinite(_run(pipe)).all()
    before = {name: snapshot(m) for name, m in (("unet", pipe.unet), ("vae", pipe.vae))}
    report = diagnose_pipeline(pipe, prompt="a red circle")
    assert [f for f in report.findings if f.severity != "info"] == []
    components = report.to_dict()["target"]["components"]
    assert [(c["name"], c["class"], c["dtype"], c["devices"]) for c in components] == [
        ("vae", "AutoencoderKL", "float32", ["cpu"]), ("text_encoder", "CLIPTextModel", "float32", ["cpu"]),
        ("unet", "UNet2DConditionModel", "float32", ["cpu"])]
    assert report.target.model == "StableDiffusionPipeline"
    for name, m in (("unet", pipe.unet), ("vae", pipe.vae)):
        assert_same(before[name], snapshot(m))  # nothing moved, cast or left hooked


def test_a_bf16_unet_in_a_float32_pipeline(pipe) -> None:
    pipe.unet.to(torch.bfloat16)
    try:
        with pytest.raises(RuntimeError):
            _run(pipe)
        report = diagnose_pipeline(pipe, prompt="a red circle")
    finally:
        pipe.unet.to(torch.float32)
    mismatches = found(report, "DD101")
    assert mismatches and all(f.module.startswith("unet.") for f in mismatches)  # named in the UNet, not the text encoder
    assert "unet.conv_in" in {f.module for f in mismatches}
    [f] = found(report, "DD801")
    assert (f.module, f.module_type, f.severity) == ("unet", "UNet2DConditionModel", "error")
    assert "text_encoder (float32)" in f.message and "bfloat16" in f.message
    assert any("pipe.to(torch.bfloat16)" in x.description for x in f.fixes)


def test_an_fp16_vae_that_leaves_the_range_decodes_to_nan(pipe) -> None:
    with torch.no_grad():  # a decoder whose first conv reaches ~1.5e5 in fp32, as a full-size SDXL VAE's activations do
        pipe.vae.decoder.conv_in.weight.mul_(2e4)
        pipe.vae.decoder.conv_in.bias.mul_(2e4)
    try:
        assert np.isfinite(_run(pipe)).all()  # float32 holds it
        pipe.to(torch.float16)
        assert np.isnan(_run(pipe)).all()  # fp16: a NaN image, no error
        report = diagnose_pipeline(pipe, prompt="a red circle")
    finally:
        pipe.to(torch.float32)
        with torch.no_grad():
            pipe.vae.decoder.conv_in.weight.div_(2e4)
            pipe.vae.decoder.conv_in.bias.div_(2e4)
    [f] = found(report, "DD802")
    assert (f.module, f.severity) == ("vae", "error") and "vae.decoder.conv_in" in f.message and "NaN" in f.message
    assert any("pipe.vae.to(torch.float32)" in x.description for x in f.fixes)
    assert {x.module for x in found(report, "DD301")} == {"vae.decoder.conv_in"}


def test_a_float32_lora_on_a_bf16_unet_with_no_cast_between() -> None:
    pytest.importorskip("peft")
    from peft import LoraConfig
    from peft.helpers import disable_input_dtype_casting

    pipe = tiny_sd_pipeline().to(torch.bfloat16)
    pipe.unet.add_adapter(LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian", target_modules=["to_q", "to_v"]))
    for name, p in pipe.unet.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # an adapter kept in float32, as peft keeps trainable adapters
    assert diagnose_pipeline(pipe).findings == ()  # peft casts the adapters' input: nothing to report
    with disable_input_dtype_casting(pipe.unet):  # as under CUDA autocast, or a wrapper that turns it off
        with pytest.raises(RuntimeError):
            _run(pipe)
        report = diagnose_pipeline(pipe)
    [f] = found(report, "DD502")
    assert f.module.startswith("unet.") and ".lora_A." in f.module


def test_a_float32_vae_in_an_fp16_pipeline_is_kept_with_its_latents_cast(pipe) -> None:
    pipe.to(torch.float16)
    pipe.vae.to(torch.float32)  # as SDXL users load a VAE that must not decode in fp16
    try:
        with pytest.raises(RuntimeError):  # the half latents reach the float32 post_quant_conv
            _run(pipe)
        report = diagnose_pipeline(pipe, prompt="a red circle")
    finally:
        pipe.to(torch.float32)
    [f] = found(report, "DD801")
    assert (f.module, [(r.strategy, r.target, r.to) for r in f.remedies]) == ("vae", [("vae-fp32", "vae", "float32")])


def test_the_modules_a_component_declares_fp32_are_the_pipelines_own() -> None:
    from types import SimpleNamespace

    from dtype_doctor.integrations.diffusion import PipelineComponents

    class T5Like(torch.nn.Linear):
        _keep_in_fp32_modules = ["wo"]  # as T5EncoderModel declares its feed-forward output

    text_encoder, unet = T5Like(2, 2), torch.nn.Linear(2, 2)
    container = PipelineComponents(SimpleNamespace(components={"text_encoder": text_encoder, "unet": unet, "tokenizer": None}))
    assert container._keep_in_fp32_modules == ["wo"]
    assert [n for n, _ in container.named_children()] == ["text_encoder", "unet"]
