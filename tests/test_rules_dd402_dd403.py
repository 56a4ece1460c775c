"""DD402 fp16-optimizer-eps-zero and DD403 fp16-autocast-without-loss-scaling: each shown first with a
plain run, then found by `run` on a script in the shape of the PyTorch AMP recipe
(tests/scripts/realstyle/amp_loop.py), on the CPU and simulated on a T4."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dtype_doctor.cli.main import run

SCRIPT = Path(__file__).resolve().parent / "scripts" / "realstyle" / "amp_loop.py"


def test_plain_pure_fp16_adamw_makes_untouched_embedding_rows_nan() -> None:
    assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4).half()
    opt = torch.optim.AdamW(emb.parameters(), lr=1e-3)  # eps=1e-8
    emb(torch.tensor([1, 2])).float().sum().backward()
    opt.step()
    nan_rows = torch.isnan(emb.weight).any(1)
    assert not nan_rows[1] and not nan_rows[2] and nan_rows[[0, 3, 4, 9]].all()


def test_plain_fp16_autocast_without_a_scaler_flushes_small_gradients() -> None:
    def grads(scaler: torch.amp.GradScaler) -> torch.Tensor:
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        with torch.autocast("cpu", dtype=torch.float16):
            y = lin(torch.ones(2, 4))
        scaler.scale(y.float().sum() * 1e-8).backward()  # dL/dy = 1e-8: below float16's smallest subnormal
        scaler.unscale_(torch.optim.SGD(lin.parameters(), lr=0.1))
        return lin.weight.grad

    assert grads(torch.amp.GradScaler("cpu", enabled=False)).count_nonzero() == 0
    assert grads(torch.amp.GradScaler("cpu")).count_nonzero() == 16


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *argv: str) -> list[dict]:
    shutil.copy(SCRIPT, tmp_path / "amp_loop.py")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run(["run", *argv[:-1], "-f", "json", "--", "python", "amp_loop.py", *([argv[-1]] if argv[-1] else [])])
    return json.loads(capsys.readouterr().out)["findings"]


@pytest.mark.parametrize("machine", [(), ("--simulate", "--gpu", "t4")], ids=["cpu", "t4"])
def test_run_finds_both_as_errors_and_stays_quiet_with_the_recipe(machine: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    [f] = [f for f in _run(tmp_path, monkeypatch, capsys, *machine, "") if f["severity"] == "error"]
    assert f["code"] == "DD403" and "GradScaler" in f["fixes"][0]["description"]
    half = [f for f in _run(tmp_path, monkeypatch, capsys, *machine, "--pure-half") if f["severity"] == "error"]
    assert [f["code"] for f in half] == ["DD402"] and "eps=1e-08" in half[0]["message"]
    assert any(fix["strategy"] == "fp32-trainable" for fix in half[0]["fixes"])
    assert not [f for f in _run(tmp_path, monkeypatch, capsys, *machine, "--scaler") if f["severity"] == "error"]
