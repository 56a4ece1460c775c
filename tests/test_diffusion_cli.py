"""`scan PIPELINE_DIR` and `fix PIPELINE_DIR`: a tiny Stable Diffusion pipeline saved with save_pretrained.

diffusers first: the folder loaded as a user would, with the UNet in bf16, dies in its first Conv;
loaded in fp16 with a VAE that leaves fp16's range, it decodes to NaN. Then the doctor, as a user
runs it: scan names DD801/DD802, fix casts the component in memory, re-traces, and writes the lines;
the patched script runs clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from helpers_diffusion import saved_sd_pipeline  # noqa: E402
from test_cli import cli  # noqa: E402
from conftest import validate_report  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_sd_pipeline(tmp_path_factory.mktemp("sd") / "tiny-sd")


@pytest.fixture(scope="module")
def hot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved_sd_pipeline(tmp_path_factory.mktemp("sd") / "hot-vae", hot_vae=True)


def _call(folder: Path, dtype: object) -> np.ndarray:
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(folder, dtype=dtype, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe("a red circle", num_inference_steps=1, output_type="np").images


def test_scan_a_float32_folder_is_clean(capsys, folder: Path) -> None:
    r = cli(capsys, "scan", folder, "--prompt", "a red circle", "--format", "json")
    assert r.code == 0, r.err
    report = r.json()
    validate_report(report)
    assert [f["code"] for f in report["findings"] if f["severity"] != "info"] == []
    target = report["target"]
    assert [(c["name"], c["dtype"]) for c in target["components"]] == [
        ("vae", "float32"), ("text_encoder", "float32"), ("unet", "float32")]
    assert (target["loaded_dtype"]["dtype"], target["loaded_dtype"]["origin"]) == ("float32", "default")
    assert list(folder.parent.iterdir()) == [folder]  # nothing written beside it


def test_a_bf16_unet_is_named_and_fixed(capsys, folder: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):  # the plain call: the UNet's first layer refuses the fp32 latents
        _call(folder, {"unet": torch.bfloat16, "default": torch.float32})
    report_file = tmp_path / "report.json"
    r = cli(capsys, "scan", folder, "--dtype", "unet=bf16", "--format", "rich", "-o", f"json:{report_file}")
    assert r.code == 1
    [f] = [f for f in json.loads(report_file.read_text())["findings"] if f["code"] == "DD801"]
    assert (f["module"], f["severity"]) == ("unet", "error")
    assert f["remedies"] == [{"strategy": "cast-component", "target": "unet", "to": "float32", "stage": "model-loading",
                              "source": None}]
    table = r.out[r.out.index("pipeline components"):].splitlines()[:8]
    assert any(line.split()[:3] == ["unet", "UNet2DConditionModel", "bfloat16"] for line in table)

    patch = tmp_path / "fix.patch"
    r = cli(capsys, "fix", folder, "--dtype", "unet=bf16", "--write-patch", patch, "--format", "json")
    assert r.code == 0, r.err
    fix = r.json()["fix"]
    assert fix["verified"] and fix["after"]["summary"]["error"] == 0
    assert [(s["strategy"], s["status"]) for s in fix["applied"]] == [("cast-component", "applied")]
    assert fix["patch"]["files"] == ["dtype_doctor_fix.py"]
    assert "+    pipe.unet.to(torch.float32)" in patch.read_text()


def test_an_fp16_vae_that_overflows_is_kept_in_float32(capsys, hot_folder: Path, tmp_path: Path) -> None:
    assert np.isfinite(_call(hot_folder, torch.float32)).all()
    assert np.isnan(_call(hot_folder, torch.float16)).all()  # fp16: a NaN image, no error
    script = tmp_path / "gen.py"
    script.write_text(
        "import numpy as np\nimport torch\nfrom diffusers import DiffusionPipeline\n\n"
        f"pipe = DiffusionPipeline.from_pretrained({str(hot_folder)!r}, dtype=torch.float16)\n"
        "pipe.set_progress_bar_config(disable=True)\n\n\n"
        "def main():\n"
        "    image = pipe('a red circle', num_inference_steps=1, output_type='np').images\n"
        "    print('nan' if np.isnan(image).any() else 'finite')\n\n\nmain()\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    patch = tmp_path / "fix.patch"
    r = cli(capsys, "fix", hot_folder, "--dtype", "fp16", "--script", script, "--write-patch", patch, "--format", "json")
    assert r.code == 0, r.err
    report = r.json()
    [f] = [f for f in report["findings"] if f["code"] == "DD802"]
    assert (f["module"], f["severity"]) == ("vae", "error")
    assert [s["strategy"] for s in report["fix"]["applied"]] == ["vae-fp32"]
    assert report["fix"]["verified"] and report["fix"]["after"]["findings"] == []
    assert report["fix"]["patch"]["files"] == ["gen.py"]
    subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, check=True)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert run.stdout.strip() == "finite", run.stderr[-2000:]


def test_scan_simulate_traces_the_folder_on_a_simulated_gpu(capsys, folder: Path) -> None:
    """The bf16 UNet in an fp32 pipeline, on a simulated A100: the verdicts of the real CPU trace,
    each component on cuda:0."""
    real = cli(capsys, "scan", folder, "--dtype", "unet=bf16", "--format", "json")
    r = cli(capsys, "scan", folder, "--dtype", "unet=bf16", "--simulate", "--gpu", "a100", "--format", "json")
    assert (real.code, r.code) == (1, 1), r.err
    report = r.json()
    validate_report(report)
    target = report["target"]
    assert (target["simulated"], target["device"]) == (True, "cuda:0")
    assert [(c["name"], c["dtype"], c["devices"]) for c in target["components"]] == [
        ("vae", "float32", ["cuda:0"]), ("text_encoder", "float32", ["cuda:0"]), ("unet", "bfloat16", ["cuda:0"])]
    verdicts = lambda rep: sorted((f["code"], f["module"]) for f in rep["findings"] if f["severity"] != "info")  # noqa: E731
    assert verdicts(report) == verdicts(real.json())
    assert ("DD801", "unet") in verdicts(report) and report["coverage"]["complete"]
    # The scheduler's table read at the simulated timestep: a stand-in, listed.
    assert any(s["what"].startswith("Tensor.__getitem__") for s in report["stand_ins"])
    assert list(folder.parent.iterdir()) == [folder]  # nothing written beside it


@pytest.mark.parametrize("case", ["bad-json", "custom-code", "simulate", "unknown-component", "no-diffusers"])
def test_a_folder_that_cannot_be_scanned_is_one_line(capsys, monkeypatch, tmp_path: Path, case: str) -> None:
    folder = tmp_path / "pipe"
    folder.mkdir()
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}
    (folder / "unet").mkdir()
    args = ["scan", folder]
    if case == "bad-json":
        (folder / "model_index.json").write_text("{")
    else:
        if case == "custom-code":
            index["unet"] = ["my_unet", "MyUNet"]
        (folder / "model_index.json").write_text(json.dumps(index))
    if case == "simulate":  # scan takes it (below); fix verifies on real weights
        args = ["fix", folder, "--simulate"]
    if case == "unknown-component":
        args += ["--dtype", "unt=bf16"]
    if case == "no-diffusers":
        import importlib.util

        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "diffusers" else real(name, *a))
    r = cli(capsys, *args)
    assert r.code == 2 and r.out == ""
    [line] = r.err.strip().splitlines()
    expected = {"bad-json": "not valid JSON", "custom-code": "--trust-remote-code", "simulate": "--simulate",
                "unknown-component": "did you mean 'unet'", "no-diffusers": "dtype-doctor[diffusers]"}[case]
    assert expected in line, line


def test_set_up_pipeline_inserts_before_the_first_call_and_skips_what_it_cannot_place() -> None:
    from dtype_doctor.fix.codemods import SetUpPipeline

    lines = ("{pipe}.vae.to(torch.float32)",)
    before = ("import torch\nfrom diffusers import AutoPipelineForText2Image\n\n\ndef main():\n"
              "    p = AutoPipelineForText2Image.from_pretrained('x', dtype=torch.float16).to('cuda')\n"
              "    p.unet.to(torch.bfloat16)  # the user's own cast\n\n    for prompt in ('a', 'b'):\n        p(prompt)\n")
    after = before.replace("bfloat16)  # the user's own cast\n", "bfloat16)  # the user's own cast\n    p.vae.to(torch.float32)\n")
    assert SetUpPipeline(lines).apply(before, "gen.py").new_source == after
    no_torch = "from diffusers import DiffusionPipeline\npipe = DiffusionPipeline.from_pretrained('x')\npipe('a')\n"
    assert SetUpPipeline(lines).apply(no_torch, "gen.py").new_source == (
        "from diffusers import DiffusionPipeline\nimport torch\npipe = DiffusionPipeline.from_pretrained('x')\n"
        "pipe.vae.to(torch.float32)\npipe('a')\n")
    for skipped in ("model = AutoModel.from_pretrained('x')\n",
                    "def a():\n    p = DiffusionPipeline.from_pretrained('x')\ndef b():\n    q = DiffusionPipeline.from_pretrained('y')\n"):
        assert SetUpPipeline(lines).apply(skipped, "gen.py").status == "skipped"
