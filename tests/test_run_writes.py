"""A simulated run never writes over the user's files: the script's writes land in scratch, the
report lists them (`writes`), `--keep-writes DIR` keeps them, and a real run writes as the script does.

The overlay's own semantics (a file the script wrote reads back, appends start from the user's
content, moves and removals hide instead of touching) are checked on the file API first,
then end to end on a nanoGPT-style trainer that saves `out/ckpt.pt` after its evaluation.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from dtype_doctor.machine.disk import Overlay

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_overlay_reads_back_what_the_script_wrote_and_leaves_the_users_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import torch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    torch.save({"w": torch.ones(3)}, "out/ckpt.pt")
    (tmp_path / "out" / "log.txt").write_text("real\n")
    user = {p: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    with Overlay() as disk:
        torch.save({"w": torch.zeros(5)}, "out/ckpt.pt")  # torch's zip writer opens the path in C++
        assert torch.load("out/ckpt.pt")["w"].shape == (5,)  # a save-then-load script finds its own file
        with open("out/log.txt", "a") as f:  # an append starts from the user's content, in scratch
            f.write("more\n")
        assert Path("out/log.txt").read_text() == "real\nmore\n"
        os.makedirs("runs/1", exist_ok=True)
        np.save("runs/1/a.npy", np.arange(3))
        assert np.load("runs/1/a.npy").tolist() == [0, 1, 2]
        Path("runs/tmp.json").write_text(json.dumps({"step": 1}))
        os.replace("runs/tmp.json", "runs/state.json")  # the atomic-save idiom
        assert not os.path.exists("runs/tmp.json") and json.loads(Path("runs/state.json").read_text()) == {"step": 1}
        assert sorted(os.listdir("out")) == ["ckpt.pt", "log.txt"] and sorted(os.listdir("runs")) == ["1", "state.json"]
        shutil.copy("out/ckpt.pt", "out/copy.pt")
        os.remove("out/log.txt")  # hidden from the script, not removed
        assert not os.path.exists("out/log.txt")
        with pytest.raises(FileExistsError):
            open("out/ckpt.pt", "x")
        with pytest.raises(PermissionError, match="holds back writes"):
            io.FileIO("out/raw.bin", "w")  # past the overlay: the audit hook refuses it
        held = {w.path: w.bytes for w in disk.held()}
        assert set(held) == {"out/ckpt.pt", "out/copy.pt", "runs/1/a.npy", "runs/state.json"}
        assert held["out/ckpt.pt"] == held["out/copy.pt"] > 0
        kept = disk.keep(str(tmp_path / "kept"))
    disk.cleanup()
    assert {p: p.read_bytes() for p in (tmp_path / "out").iterdir()} == user
    assert not (tmp_path / "runs").exists()
    assert torch.load(tmp_path / "kept" / "out" / "ckpt.pt")["w"].shape == (5,)
    assert len(kept) == 4
    open(tmp_path / "after.txt", "w").close()  # disarmed: writes go where they are sent


@pytest.fixture
def gpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import numpy as np
    import torch

    (tmp_path / "data").mkdir()
    for split in ("train", "val"):
        np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16).tofile(tmp_path / "data" / f"{split}.bin")
    shutil.copy(SCRIPTS / "gpt_trainer.py", tmp_path / "gpt_trainer.py")
    (tmp_path / "out").mkdir()
    torch.save({"model": {"w": torch.randn(64, 16)}, "iter_num": 5000}, tmp_path / "out" / "ckpt.pt")  # last week's run
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, json.loads(captured.out), captured.err


def _save_line() -> int:
    lines = (SCRIPTS / "gpt_trainer.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith("torch.save(checkpoint"))


def test_a_simulated_trainer_saving_its_checkpoint_leaves_the_users_checkpoint(gpt: Path, capsys: pytest.CaptureFixture) -> None:
    before = _digest(gpt / "out" / "ckpt.pt")
    code, report, err = _run(["run", "--simulate", "--steps", "3", "--keep-writes", "kept", "-f", "json", "--",
                              "python", "gpt_trainer.py", "--eval_interval=1"], capsys)
    assert "saving checkpoint to out" in err  # the script reached its save
    assert _digest(gpt / "out" / "ckpt.pt") == before
    [write] = report["writes"]
    assert write["path"] == os.path.join("out", "ckpt.pt") and write["bytes"] > 0
    assert write["source"] == {"file": "gpt_trainer.py", "line": _save_line()}
    assert "wrote 1 file(s)" in err and "kept under kept" in err
    import torch

    kept = torch.load(gpt / "kept" / "out" / "ckpt.pt", weights_only=False)
    assert kept["iter_num"] > 0 and kept["model"]["lm_head.weight"].device.type == "meta"  # the simulated step's tensors
    import tempfile

    scratch = [p for p in Path(tempfile.gettempdir()).glob("dtype-doctor-writes-*") if (p / str(gpt).lstrip(os.sep)).exists()]
    assert not scratch  # the scratch directory went with the run


def test_a_real_run_writes_as_the_script_does(gpt: Path, capsys: pytest.CaptureFixture) -> None:
    before = _digest(gpt / "out" / "ckpt.pt")
    code, report, err = _run(["run", "--keep-running", "-f", "json", "--", "python", "gpt_trainer.py", "--eval_interval=1",
                              "--max_iters=1"], capsys)
    assert "saving checkpoint to out" in err and _digest(gpt / "out" / "ckpt.pt") != before
    assert "writes" not in report
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--keep-writes", "kept", "--", "python", "gpt_trainer.py"])
    assert exit_info.value.code == 2 and "a real run writes as the script does" in capsys.readouterr().err


def test_a_fast_tokenizer_saved_and_loaded_again_stays_in_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save_pretrained of a fast tokenizer writes tokenizer.json from Rust (tokenizers.Tokenizer.save), past
    Python's open: it is routed by name, and from_pretrained of that directory reads the scratch copy."""
    from transformers import AutoTokenizer

    monkeypatch.chdir(tmp_path)
    tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "fixtures" / "models" / "bert-tiny")
    tok.save_pretrained("saved")
    user = {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    with Overlay() as disk:
        tok.add_tokens(["<new>"])
        tok.save_pretrained("saved")
        assert "<new>" in AutoTokenizer.from_pretrained("saved").get_vocab()
        assert os.path.join("saved", "tokenizer.json") in {w.path for w in disk.held()}
    disk.cleanup()
    assert {p.name: p.read_bytes() for p in (tmp_path / "saved").iterdir()} == user


def test_a_run_that_cannot_arm_leaves_the_file_system_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that fails while it arms (after the overlay, before the script) takes the overlay off
    again: __exit__ never runs for a failed __enter__, and an armed overlay would keep the process's open()."""
    import builtins

    from dtype_doctor.run.runner import RunOptions, run_script
    from dtype_doctor.run.trainer_args import TrainerArgsWatch

    def refuse(self: object) -> None:
        raise RuntimeError("arming refused")

    monkeypatch.setattr(TrainerArgsWatch, "__enter__", refuse)
    (tmp_path / "train.py").write_text("import torch\n")
    before = builtins.open
    with pytest.raises(RuntimeError, match="arming refused"):
        run_script(["python", str(tmp_path / "train.py")], options=RunOptions(simulate=True))
    assert builtins.open is before
