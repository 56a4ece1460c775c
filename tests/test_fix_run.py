"""`dtype-doctor fix --run --write-patch P -- python SCRIPT`: the seed scripts fixed as patches.

Each test works on a copy: fix --run writes the patch, `git apply` applies it, the patched
script runs under plain python (PyTorch is the oracle: it no longer dies), and `dtype-doctor
run` on it is clean.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
FIX = ROOT / "fixtures"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(FIX / "demo/data", tmp_path / "data")
    for f in SCRIPTS.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, json.loads(captured.out), captured.err


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _fix_apply_rerun(workdir: Path, capsys: pytest.CaptureFixture, script: str, args: list[str], *options: str) -> tuple[dict, str]:
    """fix --run, git apply, plain python, run: returns the fix report and the patch text."""
    before = (workdir / script).read_text()
    code, report, err = _run(["fix", "--run", *options, "--write-patch", "fix.patch", "-f", "json", "--", "python", script, *args], capsys)
    assert code == 0, err
    fix = report["fix"]
    assert fix["verified"] is True and fix["patch"]["files"] == [script], fix
    assert (workdir / script).read_text() == before  # the user's file is not touched; the patch is
    patch = (workdir / "fix.patch").read_text()
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True, capture_output=True)
    plain = subprocess.run([sys.executable, script, *args], cwd=workdir, capture_output=True, text=True, timeout=300, env=ENV)
    assert plain.returncode == 0, plain.stderr[-2000:]
    code, after, err = _run(["run", "-f", "json", "--", "python", script, *args], capsys)
    assert code == 0 and [f for f in after["findings"] if f["severity"] == "error"] == [], after["findings"]
    return report, patch


def test_fp16_cast_in_the_users_transform_is_rewritten_where_it_is(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = "seed_pil_transforms.py"
    line = _line(workdir / script, "image_tensor.to(torch.float16)")
    report, patch = _fix_apply_rerun(workdir, capsys, script, [str(FIX / "models/resnet-tiny"), str(FIX / "data/images")])
    assert [f["code"] for f in report["findings"]] == ["DD101"]
    assert f"-        image_tensor = image_tensor.to(torch.float16)" in patch
    assert f"+        image_tensor = image_tensor.to(torch.float32)" in patch
    (edit,) = [e for e in report["fix"]["patch"]["edits"] if e["status"] == "applied"]
    assert edit["codemod"] == "RetargetCast" and f"line {line}" in edit["detail"]


def test_a_cast_the_formatter_undoes_is_fixed_at_the_forward(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # dataset.map's fp16 cast does not survive datasets' torch formatter: the batch is cast where
    # the script calls its model, `model(input_tensor)`, whose forward names it pixel_values.
    script = "seed_map_autocast.py"
    report, patch = _fix_apply_rerun(workdir, capsys, script, [str(FIX / "models/resnet-tiny"), str(workdir / "data")])
    assert "+        output = model(input_tensor.to(next(model.parameters()).dtype))" in patch
    assert [e["status"] for e in report["fix"]["patch"]["edits"]] == ["skipped", "applied"]


# diffusers' train_text_to_image shape: a transform library makes the float32 images, the script's
# collate_fn only stacks them, and the call that should cast them for the half model (`vae.encode(
# batch["pixel_values"].to(weight_dtype))`) lost its cast. No user line chose float32, so the finding
# names the call, and the fix casts there.
IMAGE_LIB = """\
import numpy as np
import torch


def to_tensor(pixels):
    return torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).float().div(255)
"""

LIBRARY_IMAGES = """\
import sys

sys.path.insert(0, "site-packages")
import numpy as np
import torch
from imagelib import to_tensor

encoder = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 8)).to(torch.bfloat16)
rows = [{"pixel_values": to_tensor(np.random.randint(0, 255, (4, 4, 3), dtype=np.uint8))} for _ in range(4)]


def collate_fn(examples):
    pixel_values = torch.stack([example["pixel_values"] for example in examples])
    return {"pixel_values": pixel_values.to(memory_format=torch.contiguous_format)}


for step in range(2):
    batch = collate_fn(rows[2 * step: 2 * step + 2])
    latents = encoder(batch["pixel_values"])
print("ok", latents.dtype)
"""


def test_a_library_made_input_passed_uncast_is_named_and_cast_at_the_call(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "site-packages/imagelib").mkdir(parents=True)
    (workdir / "site-packages/imagelib/__init__.py").write_text(IMAGE_LIB)
    script = workdir / "library_images.py"
    script.write_text(LIBRARY_IMAGES)
    plain = subprocess.run([sys.executable, script.name], cwd=workdir, capture_output=True, text=True, timeout=120, env=ENV)
    assert plain.returncode != 0 and "RuntimeError" in plain.stderr  # float32 into bf16 weights
    call = _line(script, "latents = encoder(")
    code, report, _ = _run(["run", "-f", "json", "--", "python", script.name], capsys)
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert finding["source"] == {"file": script.name, "line": call}
    chain = report["lineage"][next(iter(report["lineage"]))]
    assert chain[0]["source"]["line"] == _line(script, "torch.stack") and chain[-1]["source"]["line"] == call
    fixed, patch = _fix_apply_rerun(workdir, capsys, script.name, [])
    assert "-    latents = encoder(batch[\"pixel_values\"])" in patch and "+    latents = encoder(" in patch


@pytest.mark.parametrize("mode", [[], ["--simulate", "--device", "cuda"]], ids=["cpu", "simulated-cuda"])
def test_int32_loss_target_is_cast_where_the_script_makes_it(mode: list[str], workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # The target never enters the model: the step's loss uses it. The lineage names line 23.
    script = "seed_amp_loop.py"
    report, patch = _fix_apply_rerun(workdir, capsys, script, ["1"], *mode)
    assert report["target"]["simulated"] is bool(mode)
    assert [f["code"] for f in report["findings"]] == ["DD104"]
    assert "+labels = torch.randint(0, 3, (16,)).to(torch.int64)  # ids stored compactly" in patch
    assert len([line for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]) == 1


HALF_AMP = """\
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
model = model.half()  # "saves memory"
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler(device)
for step in range(2):
    x, y = torch.randn(4, 8).to(device), torch.tensor([0, 1, 2, 0]).to(device)
    with torch.autocast(device, dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


@pytest.mark.parametrize("mode", [[], ["--simulate"]], ids=["cpu", "simulated-cuda"])
def test_half_trainable_weights_under_grad_scaler_keep_float32(mode: list[str], workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "amp.py").write_text(HALF_AMP)
    report, patch = _fix_apply_rerun(workdir, capsys, "amp.py", [], *mode)
    assert "DD401" in [f["code"] for f in report["findings"]]
    assert report["fix"]["applied"][0]["strategy"] == "fp32-trainable"
    # the conversion that made the trainable weights half goes: the model trains as it was built
    assert "-model = model.half()  # \"saves memory\"" in patch and "+model" not in patch


# The forward shares its line with the loop's header, and its input is unpacked from a dict's
# values: neither a cast of the batch nor autocast around the forward can be written there.
UNPATCHABLE = """\
import torch
model = torch.nn.Linear(4, 2).half()
inputs = {"input": torch.randn(3, 4)}
for step in range(2): model(*inputs.values())
"""


def test_a_fix_no_edit_expresses_writes_no_patch_and_says_why(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "s.py").write_text(UNPATCHABLE)
    code, report, err = _run(["fix", "--run", "--write-patch", "fix.patch", "-f", "json", "--", "python", "s.py"], capsys)
    assert code == 1 and report["fix"]["verified"] is False and report["fix"]["patch"] is None
    assert report["fix"]["patch_skipped"] and not (workdir / "fix.patch").exists()
    assert "no patch written" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["fix", "--run"], "nothing to run"),
        (["fix", "--run", "--preprocess", "p.py:f", "--", "python", "s.py"], "--preprocess is for MODEL DATASET"),
        (["fix"], "Missing argument 'MODEL'"),
    ],
)
def test_fix_run_usage_errors(argv: list[str], says: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2 and says in capsys.readouterr().err
