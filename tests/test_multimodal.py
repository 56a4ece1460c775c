"""Multimodal: a processor's float32 pixel_values against a bf16 vision tower.

transformers first. The real LLaVA (fixtures/models/llava-tiny, bf16, with its LlavaProcessor)
runs on the processor's float32 pixel_values: CLIP's embeddings cast them to the tower's dtype, so
`scan` reports that cast (DD108, info) with its lineage at the processor. A LLaVA-style model of
the user's own, whose vision tower takes pixel_values as they come (as InternVL's and
DeepSeek-VL's remote code does), dies in plain python with "Input type (float) and bias type
(c10::BFloat16) should be the same"; `run` names the patch convolution, the processor as the stage
and the script's processor line, and `fix --run` casts at the processor's output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dtype_doctor.cli.main import run
from dtype_doctor.pipeline import ScanOptions, scan
from helpers_errors import last_error, names_dtypes

FIX = Path(__file__).resolve().parent.parent / "fixtures"
LLAVA = FIX / "models/llava-tiny"
IMAGE_TEXT = FIX / "data/image-text"
SCRIPT = "vlm_llava_style.py"
ARGS = [str(LLAVA), str(IMAGE_TEXT)]


def _line(needle: str) -> int:
    text = (Path(__file__).parent / "scripts" / SCRIPT).read_text().splitlines()
    return next(i for i, line in enumerate(text, 1) if needle in line)


def test_llava_with_its_processor_casts_pixel_values_itself() -> None:
    from datasets import load_from_disk
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(LLAVA).eval()
    processor = AutoProcessor.from_pretrained(LLAVA)
    rows = load_from_disk(str(IMAGE_TEXT)).select(range(2))
    inputs = processor(text=list(rows["text"]), images=list(rows["image"]), return_tensors="pt", padding=True)
    assert model.dtype == torch.bfloat16 and inputs["pixel_values"].dtype == torch.float32
    with torch.no_grad():
        assert model(**inputs).logits.dtype == torch.bfloat16  # runs: the model casts

    report = scan(str(LLAVA), str(IMAGE_TEXT), ScanOptions())
    assert [f.code for f in report.findings if f.severity != "info"] == []
    [cast] = [f for f in report.findings if f.code == "DD108"]
    assert (cast.module, cast.stage) == ("model.vision_tower.embeddings", "processor")
    assert [(t.name, t.dtype) for t in cast.tensors][:1] == [("pixel_values", "float32")]
    lineage = report.to_dict()["lineage"]["pixel_values"]
    processor_step = next(s for s in lineage if s["stage"] == "processor")
    assert processor_step["dtype"] == "float32" and processor_step["blamed_by"] == ["DD108"]
    assert "LlavaProcessor" in processor_step["detail"]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(Path(__file__).parent / "scripts" / SCRIPT, tmp_path / SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _plain(workdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *ARGS], cwd=workdir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_llava_style_tower_dies_in_plain_python_and_run_names_the_processor(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    done = _plain(workdir)
    assert done.returncode != 0
    error, message = last_error(done.stderr)
    assert error == "RuntimeError" and names_dtypes(message, "float32", "bfloat16"), done.stderr[-2000:]

    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--format", "json", "--", "python", SCRIPT, *ARGS])
    report = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 1
    [f] = [f for f in report["findings"] if f["severity"] == "error"]
    assert (f["code"], f["module"], f["stage"]) == ("DD101", "vision.patch", "processor")
    processor_line = _line("inputs = processor(")
    assert f["source"] == {"file": SCRIPT, "line": processor_line}
    made = report["lineage"]["pixel_values"][0]
    assert (made["stage"], made["dtype"], made["source"]["line"]) == ("processor", "float32", processor_line)
    assert {x["strategy"] for x in f["fixes"]} >= {"cast-inputs"}


def test_fix_run_casts_the_processor_output(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    subprocess.run(["git", "init", "-q", "."], cwd=workdir, check=True)
    with pytest.raises(SystemExit):
        run(["fix", "--run", "--write-patch", "fix.patch", "--format", "json", "--", "python", SCRIPT, *ARGS])
    fixed = json.loads(capsys.readouterr().out)["fix"]
    assert fixed["verified"] is True
    assert [(a["strategy"], a["status"]) for a in fixed["applied"]] == [("cast-inputs", "applied")]
    patch = (workdir / "fix.patch").read_text()
    assert '+    inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)' in patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    done = _plain(workdir)
    assert done.returncode == 0 and "vlm logits torch.bfloat16" in done.stdout, done.stderr[-2000:]
