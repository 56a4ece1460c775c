"""`dtype-doctor run -- python SCRIPT`: the seed recipes (tests/scripts/) run unmodified, in-process.

PyTorch is the oracle: each script is also run under plain python, and where the doctor reports
an error the plain run dies of it (class and dtypes asserted, never one backend's wording).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from helpers_errors import last_error, names_dtypes

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
FIX = ROOT / "fixtures"


@dataclass(frozen=True)
class Seed:
    script: str
    args: tuple[str, ...]  # "{tmp}" is the test's copy of the data
    codes: tuple[str, ...]  # error-level findings, in report order
    error: tuple[str, tuple[str, ...]] | None  # what the plain run dies of: class, dtypes named
    first_step: str  # the script's own output of its first step
    # Under --simulate --device cuda: the findings a CUDA machine gives (its autocast lists cast
    # what CPU autocast("cuda"), being off, leaves mixed), and the line where the script asks a
    # value of a data-less tensor, which gets a stand-in and goes on (None: no value is read).
    simulated_codes: tuple[str, ...] = ()
    stand_in_at: str | None = None


SEEDS = [
    Seed("seed_map_autocast.py", (str(FIX / "models/resnet-tiny"), "{tmp}/data"), ("DD101",),
         ("RuntimeError", ("float32", "float16")), "step 0 logits"),
    Seed("seed_half_audit.py", (str(FIX / "models/bert-tiny"), str(FIX / "data/text-cls")), (), None,
         "audit: 0 parameters not float16", stand_in_at="logits.argmax(-1).tolist()"),
    Seed("seed_pil_transforms.py", (str(FIX / "models/resnet-tiny"), str(FIX / "data/images")), ("DD101",),
         ("RuntimeError", ("float16", "float32")), "predicted", stand_in_at="output.logits.argmax(-1).tolist()"),
    Seed("seed_amp_loop.py", ("2",), ("DD104",), ("RuntimeError", ("int32",)), "epoch 0 step 0",
         simulated_codes=("DD104",), stand_in_at="scaler.step(optimizer)"),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # A copy of the data: dataset.map writes cache files beside it.
    shutil.copytree(FIX / "demo/data", tmp_path / "data")
    for f in SCRIPTS.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _args(seed: Seed, tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in seed.args]


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.parametrize("seed", SEEDS, ids=[s.script for s in SEEDS])
def test_seed_script_under_run(seed: Seed, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(["run", "--format", "json", "--", "python", seed.script, *_args(seed, workdir)], capsys)
    report = json.loads(out)  # stdout is the report alone: the script's prints went to stderr
    errors = [f["code"] for f in report["findings"] if f["severity"] == "error"]
    assert errors == list(seed.codes), report["findings"]
    assert code == (1 if seed.codes else 0), err
    assert report["target"]["model"] == seed.script
    # The script ran its first step, and was stopped before the second.
    assert seed.first_step in err
    assert err.count(seed.first_step.split(" step")[0]) == 1 or seed.script == "seed_half_audit.py"


@pytest.mark.parametrize("seed", SEEDS, ids=[s.script for s in SEEDS])
def test_seed_script_under_simulated_cuda(seed: Seed, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # The script takes its CUDA branches (`.cuda()`, `.to(device)`, autocast(), GradScaler()) on this CPU.
    code, out, err = _run(["run", "--simulate", "--device", "cuda", "-f", "json", "--", "python", seed.script,
                           *_args(seed, workdir)], capsys)
    report = json.loads(out)
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == list(seed.simulated_codes), report["findings"]
    assert code == (1 if seed.simulated_codes else 0), err
    assert report["target"]["device"] == "cuda:0" and report["target"]["simulated"] is True
    assert report["environment"]["cuda_available"] is False  # the machine's own answer, not the script's
    assert "trace_failure" not in report
    # Every input reached the model on the simulated GPU, moved there by the script's own line.
    for chain in report["lineage"].values():
        assert chain[-1]["device"] == "cuda:0"
        moved = [s for s in chain if s["stage"] == "transfer"]
        assert moved and moved[0]["source"]["file"] == seed.script
    assert seed.first_step in err and "the simulation ends" not in err
    if seed.stand_in_at:  # the read got a stand-in, listed with the script's line; the step went on to its end
        line = _line(seed.script, seed.stand_in_at)
        assert any(s["source"] == {"file": seed.script, "line": line} for s in report["stand_ins"]), report["stand_ins"]
        assert report["coverage"]["complete"] is True


@pytest.mark.parametrize("seed", [s for s in SEEDS if s.error], ids=[s.script for s in SEEDS if s.error])
def test_plain_python_dies_of_what_run_reports(seed: Seed, workdir: Path) -> None:
    done = subprocess.run(
        [sys.executable, seed.script, *_args(seed, workdir)],
        cwd=workdir, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode != 0
    error, message = last_error(done.stderr)
    assert error == seed.error[0] and names_dtypes(message, *seed.error[1]), done.stderr[-2000:]


def test_steps_and_keep_running(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(["run", "--steps", "2", "-f", "json", "--", "python", "seed_amp_loop.py", "2"], capsys)
    assert code == 1 and "epoch 0 step 1" in err and "epoch 0 step 2" not in err
    assert [f["code"] for f in json.loads(out)["findings"]] == ["DD104"]
    # --keep-running: the report as soon as the steps are traced, then the whole run, unwatched;
    # the unwatched step 2 dies of the real error.
    code, out, err = _run(["run", "--keep-running", "-f", "json", "--", "python", "seed_amp_loop.py", "2"], capsys)
    assert code == 1 and json.loads(out)["summary"]["error"] == 1
    assert "epoch 0 step 0" in err and "epoch 0 step 1" not in err
    assert "raised RuntimeError at seed_amp_loop.py:" in err


TINY = """\
import os, sys
import torch
print("argv", sys.argv, "name", __name__, "cwd", os.getcwd())
model = torch.nn.Linear(4, 2)
if __name__ == "__main__":
    model(torch.randn(3, 4, dtype=torch.float64 if "double" in sys.argv else torch.float32))
    sys.exit(int(sys.argv[-1]))
"""


def test_argv_main_cwd_and_exit_code_as_python_gives_them(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "pkg").mkdir()
    (workdir / "pkg" / "__init__.py").write_text("")
    (workdir / "pkg" / "tiny.py").write_text(TINY)
    (workdir / "tiny.py").write_text(TINY)
    argv_before = list(sys.argv)
    code, out, err = _run(["run", "--keep-running", "--", "python", "tiny.py", "a", "3"], capsys)
    assert f"argv ['tiny.py', 'a', '3'] name __main__ cwd {workdir}" in err
    assert code == 3  # clean at --fail-on: the script's own exit code
    assert sys.argv == argv_before
    code, out, err = _run(["run", "-f", "json", "--", "python", "-m", "pkg.tiny", "double", "0"], capsys)
    assert f"argv ['{workdir / 'pkg' / 'tiny.py'}', 'double', '0'] name __main__" in err
    assert code == 1 and "DD105" in [f["code"] for f in json.loads(out)["findings"]]


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [
        ("print('no model here')\n", [], "without calling a model"),
        ("raise FileNotFoundError('data.csv')\n", [], "raised FileNotFoundError before calling a model at s.py:1"),
        (None, ["missing.py"], "no such file"),
        (None, ["-m", "no_such_module_here"], "no module named"),
        (None, [], "nothing to run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(script: str | None, argv: list[str], says: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    if script is not None:
        (workdir / "s.py").write_text(script)
        argv = ["s.py"]
    code, out, err = _run(["run", "--", *(["python", *argv] if argv else [])], capsys)
    assert code == 2 and out == ""
    assert says in err and "Traceback" not in err


def _line(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_lineage_points_at_the_users_own_lines(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # The transform's fp16 cast reaches the model: the finding points at that line.
    code, out, _ = _run(["run", "-f", "json", "--", "python", "seed_pil_transforms.py", str(FIX / "models/resnet-tiny"),
                         str(FIX / "data/images")], capsys)
    report = json.loads(out)
    (finding,) = report["findings"]
    assert finding["stage"] == "preprocess"
    assert finding["source"] == {"file": "seed_pil_transforms.py", "line": _line("seed_pil_transforms.py", "image_tensor.to(torch.float16)")}
    chain = report["lineage"]["pixel_values"]
    assert [(s["stage"], s["dtype"]) for s in chain] == [("preprocess", "float32"), ("preprocess", "float16"), ("model-boundary", "float16")]
    assert chain[0]["source"]["line"] == _line("seed_pil_transforms.py", "torch.from_numpy")

    # dataset.map's fp16 cast is undone by datasets' torch formatter: the chain says so, in the
    # user's lines (the processor call, the cast in the map function, the loop that reads the rows).
    code, out, _ = _run(["run", "-f", "json", "--", "python", "seed_map_autocast.py", str(FIX / "models/resnet-tiny"),
                         str(workdir / "data")], capsys)
    report = json.loads(out)
    (finding,) = report["findings"]
    assert finding["stage"] == "formatter"
    chain = report["lineage"]["pixel_values"]
    assert [(s["stage"], s["dtype"]) for s in chain] == [
        ("processor", "float32"), ("preprocess", "float16"), ("formatter", "float32"), ("model-boundary", "float32")]
    lines = [s["source"]["line"] if s["source"] else None for s in chain]
    script = "seed_map_autocast.py"
    # ... and the boundary names the call that handed the tensor to the model.
    assert lines == [_line(script, "processor(batch"), _line(script, "pixel_values.to(torch.float16)"), _line(script, "for step, batch"),
                     _line(script, "output = model(input_tensor)")]
    assert finding["source"] == {"file": script, "line": _line(script, "for step, batch")}


# --------------------------------------------------------------------------- the step outside the model

GAN = """\
import torch
gen = torch.nn.Linear(4, 4)
disc = torch.nn.Linear(4, 1).half()
for step in range(2):
    score = disc(gen(torch.randn(2, 4)))  # float32 into a half discriminator
    score.float().sum().backward()
"""

RAISES_AFTER = """\
import torch
model = torch.nn.Linear(4, 4)
model(torch.randn(2, 4)).sum().backward()
raise ValueError("Attempting to unscale FP16 gradients.")
"""


def test_a_crash_in_the_step_outside_the_forward_is_not_clean(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "s.py").write_text(RAISES_AFTER)
    code, out, err = _run(["run", "-f", "json", "--", "python", "s.py"], capsys)
    report = json.loads(out)
    assert code == 1 and report["summary"]["error"] >= 1
    assert [f["code"] for f in report["findings"]] == ["DD001"]
    assert report["trace_failure"]["kind"] == "other" and "s.py raised" in err


def test_a_second_model_fed_by_the_first_is_traced_with_the_step(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """The discriminator takes the generator's output: it is part of the step, and the float32 it
    receives into its half weights (PyTorch: "mat1 and mat2 must have the same dtype") is found in it."""
    (workdir / "s.py").write_text(GAN)
    code, out, err = _run(["run", "-f", "json", "--", "python", "s.py"], capsys)
    report = json.loads(out)
    assert code == 1 and [(f["code"], f["module"]) for f in report["findings"]] == [("DD101", "disc")]


HALF_AMP = """\
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
model = model.half()  # "saves memory"
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
x = torch.randn(4, 8)
y = torch.tensor([0, 1, 2, 0], dtype=torch.int32)  # class ids, stored compactly
for step in range(2):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def test_findings_outside_the_forward_name_the_users_lines(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "amp.py").write_text(HALF_AMP)
    code, out, err = _run(["run", "-f", "json", "--", "python", "amp.py"], capsys)
    report = json.loads(out)
    by_code = {f["code"]: f for f in report["findings"]}
    lines = HALF_AMP.splitlines()
    line = lambda text: next(i for i, s in enumerate(lines, 1) if text in s)  # noqa: E731
    # The loss target is a pipeline tensor the step uses outside the model: its lineage is kept.
    target = by_code["DD104"]
    assert target["stage"] != "model-code" and target["source"] == {"file": "amp.py", "line": line("dtype=torch.int32")}
    assert [s["stage"] for s in report["lineage"]["target"]][-1] == "loss"
    # Parameter findings name the user's .half() that made the parameters what they are.
    for code_ in ("DD401", "DD110"):
        assert by_code[code_]["source"] == {"file": "amp.py", "line": line("model.half()")}
    assert code == 1


DEVICE_CONTEXT = """\
import torch
model = torch.nn.Linear(4, 2)
with torch.device("meta"):
    for step in range(3):
        model(torch.randn(3, 4, device="cpu"))
        print("step", step, "new tensors land on", torch.empty(1).device)
"""


def test_keep_running_leaves_the_scripts_own_modes_alone(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "ctx.py").write_text(DEVICE_CONTEXT)
    code, out, err = _run(["run", "--keep-running", "-f", "json", "--", "python", "ctx.py"], capsys)
    assert [line for line in err.splitlines() if line.startswith("step")] == [
        f"step {i} new tensors land on meta" for i in range(3)]
    assert code == 0


def test_a_relative_output_is_the_invoking_directorys(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "sub").mkdir()
    (workdir / "chd.py").write_text("import os, torch\nos.chdir('sub')\nm = torch.nn.Linear(2, 2)\nm(torch.randn(1, 2))\nm(torch.randn(1, 2))\n")
    code, out, err = _run(["run", "-f", "json", "-o", "report.json", "--", "python", "chd.py"], capsys)
    assert code == 0 and json.loads((workdir / "report.json").read_text())["target"]["model"] == "chd.py"
    assert not (workdir / "sub" / "report.json").exists()


def test_an_unknown_option_before_the_script_is_named(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(["run", "--epochs", "3", "--", "python", "seed_amp_loop.py"], capsys)
    assert code == 2 and "no such option: --epochs" in err


def test_weight_norm_parametrizations_are_not_taken_for_the_model(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # wav2vec2's positional conv uses weight_norm: `.half()` calls its ParametrizationList at
    # top level, with no input, before the real forward (which raises on fp32 features).
    script = Path(__file__).parent / "pipelines" / "audio_half.py"
    code, out, _ = _run(
        ["run", "--format", "json", "--", "python", str(script), str(FIX / "models/wav2vec2-tiny"), str(FIX / "data/audio")],
        capsys,
    )
    report = json.loads(out)
    assert code == 1 and report["target"]["model"].endswith("audio_half.py")
    assert [(f["code"], f["module"]) for f in report["findings"]] == [("DD101", "wav2vec2.feature_extractor.conv_layers.0.conv")]
    assert report["findings"][0]["source"]["line"] == 18  # the feature extractor's fp32 batch
    plain = subprocess.run([sys.executable, str(script), str(FIX / "models/wav2vec2-tiny"), str(FIX / "data/audio")], capture_output=True, text=True)
    error, message = last_error(plain.stderr)
    assert plain.returncode != 0 and error == "RuntimeError" and names_dtypes(message, "float16", "float32")
