"""The one GPU table (machine/gpus.py): the CLI help and the docs list every profile in it, and
the Blackwell profiles simulate as torch would report the cards."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from dtype_doctor.cli import options
from dtype_doctor.cli.main import run
from dtype_doctor.machine.gpus import CAPABILITIES, PROPERTIES, gpu_profile

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/simulation.md", "docs/commands/scan.md")


def test_every_profile_has_its_properties() -> None:
    assert set(PROPERTIES) == set(CAPABILITIES)


def test_the_cli_help_reads_the_table() -> None:
    [option] = [m for m in typing.get_args(options.Gpu)[1:] if hasattr(m, "help")]
    assert all(name in option.help for name in CAPABILITIES)


@pytest.mark.parametrize("page", DOCS)
def test_the_docs_name_every_profile(page: str) -> None:
    text = (ROOT / page).read_text()
    assert [name for name in CAPABILITIES if name not in text] == []


def test_blackwell_profiles() -> None:
    b200, rtx5090 = gpu_profile("B200"), gpu_profile("rtx5090")
    assert b200 is not None and rtx5090 is not None
    assert (b200.capability, rtx5090.capability) == ((10, 0), (12, 0))
    assert 178 * 2**30 <= b200.memory < 192 * 10**9 and rtx5090.memory == 32 * 2**30


SCRIPT = """\
import torch
p = torch.cuda.get_device_properties(0)
print("gpu", p.name, torch.cuda.get_device_capability(), p.total_memory // 2**30, torch.cuda.is_bf16_supported(including_emulation=False))
model = torch.nn.Linear(8, 4).cuda().to(torch.bfloat16)
model(torch.randn(2, 8, device="cuda", dtype=torch.bfloat16)).float().sum().backward()
"""


def test_run_simulate_on_a_b200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "--gpu", "b200", "-f", "json", "--", "python", "train.py"])
    out, err = capsys.readouterr()
    assert "gpu NVIDIA B200 (10, 0) 178 True" in err
    report = json.loads(out)
    assert exit_info.value.code == 0 and report["target"]["gpu"] == "b200 (compute capability 10.0)"


def test_scan_simulate_on_a_b200(capsys: pytest.CaptureFixture) -> None:
    from test_cli import cli

    r = cli(capsys, "scan", ROOT / "fixtures/models/bert-tiny", ROOT / "fixtures/data/text-cls", "--simulate",
            "--device", "cuda", "--dtype", "bfloat16", "--gpu", "b200", "--format", "json")
    report = r.json()
    assert r.code == 0 and report["target"]["gpu"] == "b200 (compute capability 10.0)"
    assert not [f for f in report["findings"] if f["code"] == "DD107"]
