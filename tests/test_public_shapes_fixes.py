"""The fix side of the script sweep's injections (benchmarks/script_sweep.py, issue 38), on team-written scripts in
the shapes of public ones (tests/scripts_public_shapes/): a bug injected as a text edit, `fix --run` writes a patch
at the line that decided the dtype or device, and the patched script then runs (plainly on this CPU, and under the
simulated GPU the bug belongs to). The finding side's shapes are tests/test_public_shapes.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from test_public_shapes import T4, _cli, _errors, _line_of, _named_at, _python, _workspace


def test_fp16_autocast_with_a_disabled_gradscaler_is_fixed_by_enabling_it_on_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why DD403 is an error: float16 holds nothing below 2**-24, so an unscaled gradient of 1e-8 is 0 in the
    # fp16 backward; GradScaler's 65536 keeps it (the scaled value is representable).
    small = torch.tensor(1e-8)
    assert small.half().item() == 0.0 and (small * 65536).half().item() != 0.0
    # nanoGPT's / llama2.c's train.py with the scaler made disabled (the sweep's no-scaler injection).
    made = 'scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))'
    off = "scaler = torch.cuda.amp.GradScaler(enabled=False)"
    root = _workspace(tmp_path, "amp_loop.py", made, off)
    monkeypatch.chdir(root)
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "amp_loop.py"], capsys)
    assert report is not None, err[-2000:]
    line = _line_of(root, "amp_loop.py", off)
    before = [f for f in report["findings"] if f["code"] == "DD403"]
    assert before and _named_at(before[0], "amp_loop.py", line), report["findings"]
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    # The flag the script's own float16 choice decides (off again in its bfloat16 and float32 modes).
    assert "+scaler = torch.cuda.amp.GradScaler(enabled=(ptdtype == torch.float16))" in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "amp_loop.py"], capsys)
    assert code == 0 and _errors(report) == [], report["findings"]
    assert _python(root, "amp_loop.py").returncode == 0


def test_an_lstm_hidden_state_made_on_the_cpu_in_init_hidden_gets_device_there(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # word_language_model's init_hidden, called from the script's loop (outside forward), with device= dropped:
    # the LSTM refuses a hidden state on another device than its input (its own _check_input_device, on CUDA).
    lstm = torch.nn.LSTM(4, 4)
    with pytest.raises(RuntimeError):
        lstm(torch.zeros(2, 1, 4, device="meta"), (torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)))
    old = ("        return (weight.new_zeros(self.nlayers, bsz, self.nhid),\n"
           "                weight.new_zeros(self.nlayers, bsz, self.nhid))")
    new = ("        return (torch.zeros(self.nlayers, bsz, self.nhid),\n"
           "                torch.zeros(self.nlayers, bsz, self.nhid))")
    root = _workspace(tmp_path, "lstm_lm.py", old, new)
    monkeypatch.chdir(root)
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "lstm_lm.py"], capsys)
    assert report is not None and code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    # device= where the state is made, from the model's own parameters; the script's loop is left as it was.
    assert patch.count("device=next(self.parameters()).device") == 2 and "+    hidden" not in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "lstm_lm.py"], capsys)
    assert code == 0 and _errors(report) == [], report["findings"]
    assert _python(root, "lstm_lm.py").returncode == 0


SLOW_STEP = '''
import time
import torch
import torch.nn as nn


class Policy(nn.Module):  # trl's GRPO shape: the step generates (many small forwards) before its loss
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(1000):
            x = torch.tanh(self.lin(x))
            time.sleep(0.01)
        return x


model = Policy()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(2, 4)).sum()
loss.backward()
opt.step()
'''


def test_a_step_that_runs_past_the_timeout_is_said_as_a_timeout_not_as_a_dd001(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # S13: trl's grpo stopped by --timeout in its generation was a false DD001 error on a script that runs.
    (tmp_path / "grpo_like.py").write_text(SLOW_STEP)
    monkeypatch.chdir(tmp_path)
    code, report, err = _cli(["run", "--timeout", "3", "-f", "json", "--", "python", "grpo_like.py"], capsys)
    assert code == 2 and "--timeout" in err  # the doctor's limit, said on stderr
    assert report is not None and report["findings"] == [], report["findings"]
    assert report["coverage"]["complete"] is False and "--timeout" in report["coverage"]["stopped"], report["coverage"]


def test_a_model_left_on_the_cpu_while_the_prompt_is_made_on_the_gpu_moves_where_the_script_sets_it_up(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # S11, nanoGPT's sample.py: the prompt is made on the GPU (device=), the model's own generate() calls the
    # forward. The model moves (never the prompt to the CPU), after it is built and set to eval.
    root = _workspace(tmp_path, "sample_lm.py", "model.to(device)\n", "pass  # the model left on the CPU\n")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "sample_lm.py"], capsys)
    dd201 = [f for f in _errors(report) if f["code"] == "DD201"]
    assert dd201 and all(r["target"] == "model" and r["to"].startswith("cuda") for r in dd201[0]["remedies"]), report["findings"]
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "sample_lm.py"], capsys)
    assert report is not None and code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    assert " model.eval()\n+model.to(device)\n" in patch and "device=device)[None, ...]).to" not in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "--keep-running", "-f", "json", "--", "python", "sample_lm.py"], capsys)
    assert report is not None and _errors(report) == [], report["findings"]
    assert _python(root, "sample_lm.py").returncode == 0


def test_bfloat16_autocast_on_a_t4_is_fixed_by_running_the_scripts_autocast_in_float16(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # nanoGPT's train.py with its autocast pinned to bfloat16 on a T4 (sm75: no bfloat16 tensor cores, DD107's
    # warning). Asked to fix warnings, fix --run retargets the script's own autocast; its GradScaler is on.
    made = "torch.amp.autocast(device_type=device_type, dtype=ptdtype)"
    pinned = "torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)"
    root = _workspace(tmp_path, "amp_loop.py", made, pinned)
    monkeypatch.chdir(root)
    code, report, err = _cli(["fix", "--run", *T4, "--fail-on", "warning", "--write-patch", str(root / "fix.patch"),
                              "-f", "json", "--", "python", "amp_loop.py"], capsys)
    assert report is not None and any(f["code"] == "DD107" for f in report["findings"]), err[-2000:]
    # Named where the script made the autocast it enters (`ctx = ...`, entered by `with ctx:` around the call).
    line = _line_of(root, "amp_loop.py", pinned)
    assert all(_named_at(f, "amp_loop.py", line) for f in report["findings"] if f["code"] == "DD107"), report["findings"]
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    assert "+ctx = nullcontext() if device_type == \"cpu\" else torch.amp.autocast(device_type=device_type, dtype=torch.float16)" in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "amp_loop.py"], capsys)
    assert code == 0 and report["findings"] == [], report["findings"]
    assert _python(root, "amp_loop.py").returncode == 0


def test_float64_numpy_noise_is_cast_where_it_enters_torch_before_its_move() -> None:
    # pytorch/examples dcgan's noise made with numpy (float64 by default) for a float32 generator: the plain call
    # fails, and the cast goes on torch.from_numpy, where numpy's dtype enters, not after the move.
    import numpy as np

    from dtype_doctor.fix import codemods as cm

    conv = torch.nn.ConvTranspose2d(8, 4, 4)
    with pytest.raises(RuntimeError):
        conv(torch.from_numpy(np.random.randn(2, 8, 1, 1)))
    src = ("import torch\nfor i, data in enumerate(loader):\n"
           "    noise = torch.from_numpy(__import__('numpy').random.randn(batch_size, nz, 1, 1)).to(device)\n"
           "    fake = netG(noise)\n")
    out = cm.CastWhereMade(3, "float32").apply(src, "main.py")
    assert out.applied and ".random.randn(batch_size, nz, 1, 1)).to(torch.float32).to(device)\n" in out.new_source, out
    noise = torch.from_numpy(np.random.randn(2, 8, 1, 1)).to(torch.float32).to("cpu")
    assert conv(noise).dtype == torch.float32


def test_fp16_autocast_with_no_gradscaler_gets_one_around_the_scripts_backward_and_step(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same loop with no scaler at all, and a gradient clip: the scaler is made after the optimizer, the clip
    # sees unscaled gradients (unscale_ before it), and the script runs after the patch.
    made = 'scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))\n'
    root = _workspace(tmp_path, "amp_loop.py", made, "")
    text = (root / "amp_loop.py").read_text()
    loop = "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
    plain = "    loss.backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    optimizer.step()\n"
    (root / "amp_loop.py").write_text(text.replace(loop, plain))
    monkeypatch.chdir(root)
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "amp_loop.py"], capsys)
    assert report is not None and any(f["code"] == "DD403" for f in report["findings"]), err[-2000:]
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    for line in ('+scaler = torch.amp.GradScaler("cuda")', "+    scaler.scale(loss).backward()",
                 "+    scaler.unscale_(optimizer)", "+    scaler.step(optimizer)", "+    scaler.update()"):
        assert line in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "amp_loop.py"], capsys)
    assert code == 0 and _errors(report) == [], report["findings"]
    assert _python(root, "amp_loop.py").returncode == 0


def test_float64_numpy_data_that_fails_before_the_model_is_named_where_made_and_cast_there(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plain call first: float64 data meets the script's float32 weights in a matmul of its own, before any model.
    with pytest.raises(RuntimeError):
        torch.zeros(2, 3, dtype=torch.float64).mm(torch.zeros(3, 1))
    made = "    points = torch.from_numpy(np.random.rand(size).astype(np.float32))"
    float64 = "    points = torch.from_numpy(np.random.rand(size))"
    root = _workspace(tmp_path, "poly_fit.py", made, float64)
    monkeypatch.chdir(root)
    assert _python(root, "poly_fit.py").returncode != 0  # the script fails plainly, on any machine
    line = _line_of(root, "poly_fit.py", float64)
    code, report, err = _cli(["run", "-f", "json", "--", "python", "poly_fit.py"], capsys)
    assert code == 1 and report is not None, err[-2000:]
    errors = _errors(report)
    assert [f["code"] for f in errors] == ["DD101"] and _named_at(errors[0], "poly_fit.py", line), errors
    assert {t["name"]: t["dtype"] for t in errors[0]["tensors"]} == {"W_true": "float32", "x": "float64"}
    code, report, err = _cli(["fix", "--run", "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "poly_fit.py"], capsys)
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    assert _python(root, "poly_fit.py").returncode == 0
    assert "torch.float32" in (root / "poly_fit.py").read_text().splitlines()[line - 1]


def test_an_error_before_the_model_that_is_no_dtype_error_is_said_as_the_script_raised(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # A shape error of the script's own, before the model: no finding is made up for it (exit 2, the error named).
    with pytest.raises(RuntimeError):
        torch.zeros(2, 3).mm(torch.zeros(2, 1))
    root = _workspace(tmp_path, "poly_fit.py", "W_true = torch.randn(DEGREE, 1)", "W_true = torch.randn(DEGREE + 1, 1)")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", "-f", "json", "--", "python", "poly_fit.py"], capsys)
    assert code == 2 and report is None and "raised RuntimeError before calling a model" in err, err[-2000:]


def test_float64_noise_into_a_second_model_of_the_step_is_named_where_made_and_cast_there(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plain call first: float64 noise into the generator's float32 Linear.
    with pytest.raises(RuntimeError):
        torch.nn.Linear(4, 2)(torch.zeros(1, 4, dtype=torch.float64))
    made = "    noise = torch.randn(real.size(0), nz, device=device)"
    float64 = "    noise = torch.from_numpy(__import__('numpy').random.randn(real.size(0), nz)).to(device)"
    root = _workspace(tmp_path, "gan_loop.py", made, float64)
    monkeypatch.chdir(root)
    assert _python(root, "gan_loop.py").returncode != 0
    line = _line_of(root, "gan_loop.py", float64)
    code, report, err = _cli(["run", "-f", "json", "--", "python", "gan_loop.py"], capsys)
    errors = _errors(report)
    # The generator joins the step second: its input is named as the loop made it, not as a tensor of the step.
    assert [f["code"] for f in errors] == ["DD101"] and _named_at(errors[0], "gan_loop.py", line), errors
    code, report, err = _cli(["fix", "--run", "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "gan_loop.py"], capsys)
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    assert "torch.float32" in (root / "gan_loop.py").read_text().splitlines()[line - 1]
    assert _python(root, "gan_loop.py").returncode == 0
