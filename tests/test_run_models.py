"""`dtype-doctor run` of a script whose step calls several models: each is traced as itself.

A diffusers pipeline script as a user writes it (from_pretrained, one component cast, one call)
and a teacher/student script. Plain python first: the pipeline with a bf16 UNet dies of "mat1 and
mat2 must have the same dtype"; the student in bf16 dies on the float32 batch; the fp16 pipeline
whose VAE leaves float16's range returns a NaN image with no error. Then the doctor names each
finding inside its model ("unet.conv_in", "student.0"), the user's line, and each model's dtype.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtype_doctor.cli.main import run
from helpers_errors import raises_dtype_error

pytest.importorskip("diffusers")

PIPELINE_SCRIPT = """\
import sys

import torch
from diffusers import StableDiffusionPipeline

pipe = StableDiffusionPipeline.from_pretrained(sys.argv[1], torch_dtype=getattr(torch, sys.argv[2]))
pipe.set_progress_bar_config(disable=True)
if sys.argv[3] == "bf16-unet":
    pipe.unet.to(torch.bfloat16)
elif sys.argv[3] == "fp32-vae":  # "keep the VAE in fp32", half done: nothing casts the latents it decodes
    pipe.vae.to(torch.float32)
pipe.to(sys.argv[4])
image = pipe("a cat", num_inference_steps=2, output_type="np").images
print("nan image:", bool(image.mean() != image.mean()))
"""

# The components loaded one by one into variables of their own, then handed to the pipeline (diffusers'
# "load components separately" recipe): the first model called (the text encoder) is held by a variable too.
COMPONENTS_SCRIPT = """\
import sys

import torch
from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
from transformers import CLIPTextModel

text_encoder = CLIPTextModel.from_pretrained(sys.argv[1], subfolder="text_encoder")
unet = UNet2DConditionModel.from_pretrained(sys.argv[1], subfolder="unet").to(torch.bfloat16)
vae = AutoencoderKL.from_pretrained(sys.argv[1], subfolder="vae")
pipe = StableDiffusionPipeline.from_pretrained(sys.argv[1], text_encoder=text_encoder, unet=unet, vae=vae)
pipe.set_progress_bar_config(disable=True)
image = pipe("a cat", num_inference_steps=2, output_type="np").images
"""

DISTILL_SCRIPT = """\
import torch
from torch import nn

teacher = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(torch.bfloat16)
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(4, 8)
    with torch.no_grad():
        target = teacher(x)
    out = student(x)
    loss = nn.functional.mse_loss(out.float(), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pipeline saved as a user's checkpoint, and a copy whose VAE decoder leaves fp16's range."""
    from helpers_diffusion import tiny_sd_pipeline

    root = tmp_path_factory.mktemp("pipelines")
    pipe = tiny_sd_pipeline()
    pipe.save_pretrained(root / "sd")
    with torch.no_grad():  # a first decoder conv reaching ~1.5e5 in fp32, as a full-size SDXL VAE's activations do
        pipe.vae.decoder.conv_in.weight.mul_(2e4)
        pipe.vae.decoder.conv_in.bias.mul_(2e4)
    pipe.save_pretrained(root / "sd-hot-vae")
    return root


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "generate.py").write_text(PIPELINE_SCRIPT)
    (tmp_path / "distill.py").write_text(DISTILL_SCRIPT)
    (tmp_path / "components.py").write_text(COMPONENTS_SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _line(script: str, text: str) -> int:
    return next(i for i, s in enumerate(script.splitlines(), 1) if text in s)


def _plain(script: str, *args: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [script, *args])
    runpy.run_path(script, run_name="__main__")


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, json.loads(captured.out), captured.err


def _by_code(report: dict, code: str) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == code]


@pytest.mark.parametrize("simulate", [False, True], ids=["real", "simulated"])
def test_a_pipeline_script_with_a_bf16_unet(simulate: bool, pipelines: Path, workdir: Path,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    args = [str(pipelines / "sd"), "float32", "bf16-unet", "cuda" if simulate else "cpu"]
    if not simulate:
        with raises_dtype_error("float32", "bfloat16"):
            _plain("generate.py", *args, monkeypatch=monkeypatch)
    code, report, err = _run(["run", *(["--simulate"] if simulate else []), "-f", "json", "--",
                              "python", "generate.py", *args], capsys)
    cast = {"file": "generate.py", "line": _line(PIPELINE_SCRIPT, "pipe.unet.to(torch.bfloat16)")}
    assert code == 1
    components = {c["name"]: c for c in report["target"]["components"]}
    assert {d for c in components.values() for d in c["devices"]} == {"cuda:0" if simulate else "cpu"}
    assert [(n, c["class"], c["dtype"]) for n, c in components.items()] == [
        ("vae", "AutoencoderKL", "float32"), ("text_encoder", "CLIPTextModel", "float32"),
        ("unet", "UNet2DConditionModel", "bfloat16")]
    # How the script's from_pretrained loaded each: float32, as torch_dtype= named (the cast came after).
    assert {(n, c["loaded_dtype"]["dtype"], c["loaded_dtype"]["origin"]) for n, c in components.items()} == {
        ("vae", "float32", "argument"), ("text_encoder", "float32", "argument"), ("unet", "float32", "argument")}
    mismatches = _by_code(report, "DD101")
    assert mismatches and all(f["module"].startswith("unet.") for f in mismatches)  # in the UNet, not the text encoder
    assert "unet.conv_in" in {f["module"] for f in mismatches}
    assert all(f["source"] == cast for f in mismatches if f["module_type"] in ("Linear", "Conv2d"))
    [mixed] = _by_code(report, "DD801")
    assert (mixed["module"], mixed["source"]) == ("unet", cast) and "text_encoder (float32)" in mixed["message"]
    assert _by_code(report, "DD102") == []  # each model is judged on its own dtype
    # The negative prompt's encoder call and the second denoising step ran (repaired), not kept.
    assert report["coverage"]["skipped"]["calls"] == {"text_encoder": 1, "unet": 1}
    assert report["coverage"]["complete"] is True  # through the VAE's decode
    # The negative prompt's encoder call came before anything needed a repair: unwatched. The UNet's first
    # call needed repairs, so its repeat was watched (and repaired), as the plain script would fail there.
    # A simulated run watches every call: its stand-ins need the recorder.
    assert report["coverage"]["skipped"].get("unwatched", 0) == (0 if simulate else 1)
    assert "nan image: False" in err  # the step went on to the decoded image
    if simulate:  # the scheduler's alphas_cumprod[timestep] read the CUDA timestep: a stand-in, listed
        assert any(s["what"].startswith("Tensor.__getitem__") for s in report["stand_ins"])


def test_components_held_in_their_own_variables_are_traced_as_the_pipeline(
        pipelines: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    with raises_dtype_error("float32", "bfloat16"):  # the bf16 UNet fed the float32 latents
        _plain("components.py", str(pipelines / "sd"), monkeypatch=monkeypatch)
    code, report, err = _run(["run", "-f", "json", "--", "python", "components.py", str(pipelines / "sd")], capsys)
    # The step is the pipeline's call, not the text encoder's alone (which would read complete and clean).
    assert code == 1
    assert {c["name"] for c in report["target"]["components"]} == {"vae", "text_encoder", "unet"}
    mismatches = _by_code(report, "DD101")
    assert mismatches and all(f["module"].startswith("unet.") for f in mismatches)


def test_an_fp16_pipeline_whose_vae_leaves_the_range(pipelines: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    args = [str(pipelines / "sd-hot-vae"), "float16", "as-loaded", "cpu"]
    _plain("generate.py", *args, monkeypatch=monkeypatch)
    assert "nan image: True" in capsys.readouterr().out  # no error: a NaN image
    code, report, err = _run(["run", "-f", "json", "--", "python", "generate.py", *args], capsys)
    [f] = _by_code(report, "DD802")
    assert (f["module"], f["severity"]) == ("vae", "error") and "vae.decoder.conv_in" in f["message"]
    # The line that made the VAE float16: the pipeline's from_pretrained(..., torch_dtype=torch.float16).
    assert f["source"] == {"file": "generate.py", "line": _line(PIPELINE_SCRIPT, "StableDiffusionPipeline.from_pretrained")}
    assert {x["module"] for x in _by_code(report, "DD301")} == {"vae.decoder.conv_in"}
    assert code == 1
    # Nothing in the step needed a repair (the plain script ran): the repeats (the negative prompt's encoder
    # call, the second denoising step) ran unwatched, at the script's own pace, and the report says so.
    assert report["coverage"]["skipped"] == {"calls": {"text_encoder": 1, "unet": 1}, "ops": 0, "unwatched": 2}


def test_a_finding_in_the_student_names_the_student(workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    with raises_dtype_error("float32", "bfloat16"):
        _plain("distill.py", monkeypatch=monkeypatch)
    code, report, err = _run(["run", "-f", "json", "--", "python", "distill.py"], capsys)
    assert code == 1
    assert [(c["name"], c["dtype"]) for c in report["target"]["components"]] == [("teacher", "float32"), ("student", "bfloat16")]
    [f] = _by_code(report, "DD101")
    assert (f["module"], f["module_type"]) == ("student.0", "Linear")
    assert f["source"] == {"file": "distill.py", "line": _line(DISTILL_SCRIPT, "x = torch.randn")}  # the batch it was fed
    [half] = _by_code(report, "DD110")  # the student's bf16 trainables, named at the line that made them so
    assert half["module"].startswith("student.") and half["source"]["line"] == _line(DISTILL_SCRIPT, "student = ")
    assert half["message"].startswith("4 of 4 trainable")  # the teacher, called under no_grad, trains nowhere
    assert _by_code(report, "DD102") == [] and _by_code(report, "DD801") == []
    assert report["coverage"]["steps"] == 1 and report["coverage"]["phases"]["optimizer"] is True


@pytest.mark.parametrize(("folder", "dtype", "cast", "strategy", "plain_fails"), [
    ("sd", "float32", "bf16-unet", "cast-component", True),
    ("sd-hot-vae", "float16", "as-loaded", "vae-fp32", False),
    # DD801 at vae, DD101 at vae.post_quant_conv: the VAE's own fix clears both (autocast around the
    # call, the DD101's first edit, would run the fp32 VAE in fp16 again).
    ("sd", "float16", "fp32-vae", "vae-fp32", True),
], ids=["bf16-unet", "fp16-vae", "fp32-vae"])
def test_fix_run_writes_the_pipeline_fix_into_the_script(folder: str, dtype: str, cast: str, strategy: str, plain_fails: bool,
                                                          pipelines: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    args = [str(pipelines / folder), dtype, cast, "cpu"]
    if plain_fails:
        with pytest.raises(RuntimeError):
            _plain("generate.py", *args, monkeypatch=monkeypatch)
    else:
        _plain("generate.py", *args, monkeypatch=monkeypatch)
        assert "nan image: True" in capsys.readouterr().out
    code, report, err = _run(["fix", "--run", "--write-patch", "fix.patch", "-f", "json", "--", "python", "generate.py", *args], capsys)
    fix = report["fix"]
    assert code == 0, err[-2000:]
    assert fix["verified"] and fix["after"]["summary"]["error"] == 0
    assert [s["strategy"] for s in fix["applied"] if s["status"] == "applied"] == [strategy]
    assert fix["patch"]["files"] == ["generate.py"]
    assert (workdir / "generate.py").read_text() == PIPELINE_SCRIPT  # only the patch is written
    # The lines go after the user's cast and the move, before the pipeline's first call.
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    patched = (workdir / "generate.py").read_text().splitlines()
    call = next(i for i, s in enumerate(patched) if s.startswith("image = pipe("))
    component = "unet" if strategy == "cast-component" else "vae"
    assert patched[_line(PIPELINE_SCRIPT, "pipe.to(sys.argv[4])")].startswith(f"pipe.{component}.to(torch.float32)")
    assert call > _line(PIPELINE_SCRIPT, "pipe.to(sys.argv[4])")
    _plain("generate.py", *args, monkeypatch=monkeypatch)  # the patched script, plainly: no error, a finite image
    assert "nan image: False" in capsys.readouterr().out


# train_text_to_image.py's placement, in plain torch: frozen models moved and cast side by side,
# one of them cast but left on the CPU (its device dropped from its .to(...)).
PLACED_SCRIPT = """\
import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
weight_dtype = torch.float16 if device == "cuda" else torch.float32
torch.manual_seed(0)
text_encoder = nn.Embedding(16, 8)
vae = nn.Linear(8, 8)
unet = nn.Linear(8, 8)
text_encoder.to(dtype=weight_dtype)
vae.to(device, dtype=weight_dtype)
unet.to(device)
ids = torch.randint(0, 16, (2, 4), device=device)
with torch.no_grad():
    hidden = text_encoder(ids)
    latents = vae(hidden)
loss = unet(latents.float()).pow(2).mean()
loss.backward()
"""


def test_one_of_several_models_left_on_the_cpu_moves_where_the_script_placed_it(
        workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """On a GPU the text encoder on the CPU meets ids on cuda: "Expected all tensors to be on the same
    device" at the embedding (CUDA's index_select wrapper; on this CPU the plain script runs, all on cpu)."""
    (workdir / "placed.py").write_text(PLACED_SCRIPT)
    code, report, err = _run(["fix", "--run", "--simulate", "--gpu", "t4", "--write-patch", "fix.patch", "-f", "json",
                              "--", "python", "placed.py"], capsys)
    placed = {"file": "placed.py", "line": _line(PLACED_SCRIPT, "text_encoder.to(dtype=weight_dtype)")}
    # One finding for the model's placement (not one per layer), named where the script placed that model.
    [f] = _by_code(report, "DD201")
    assert (f["module"].split(".")[0], f["source"]) == ("text_encoder", placed) and "text_encoder is on cpu" in f["message"]
    assert [r["target"] for r in f["remedies"]] == ["model"]
    assert code == 0 and report["fix"]["verified"], err[-2000:]
    patch = (workdir / "fix.patch").read_text()
    added = [ln for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert added == ["+text_encoder.to(device, dtype=weight_dtype)"]


def test_a_model_left_on_the_cpu_whose_output_reaches_the_next_one_moves_where_placed(
        workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """diffusers' train_dreambooth.py: encode_prompt moves the ids to the text encoder's device, so the text
    encoder left on the CPU runs there and the UNet on the GPU meets its output (on a GPU: "Expected all
    tensors to be on the same device" in the UNet's cross-attention). The text encoder moves, not the batch."""
    script = PLACED_SCRIPT.replace("    hidden = text_encoder(ids)", "    hidden = text_encoder(ids.to(text_encoder.weight.device))")
    (workdir / "placed.py").write_text(script)
    code, report, err = _run(["fix", "--run", "--simulate", "--gpu", "t4", "--write-patch", "fix.patch", "-f", "json",
                              "--", "python", "placed.py"], capsys)
    [f] = _by_code(report, "DD201")
    assert f["module"].split(".")[0] == "vae" and f["source"]["line"] == _line(script, "text_encoder.to(dtype=weight_dtype)")
    assert code == 0 and report["fix"]["verified"], err[-2000:]
    added = [ln for ln in (workdir / "fix.patch").read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert added == ["+text_encoder.to(device, dtype=weight_dtype)"]
