"""The file system under simulation, completed (machine/disk.py, machine/disk_listing.py).

What a script on a fresh machine does first: create a cache folder that does not exist yet
(`load_dataset(..., cache_dir=...)`), list what it saved (`os.scandir`, `os.walk`, `glob`, pathlib),
and use libraries that make temporary files and sockets (`tempfile`, multiprocessing). Each is shown
on the plain file system first, then under the overlay: the script sees the same, the user's files
stay as they were.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from dtype_doctor.machine.disk import Overlay


def _listings() -> dict[str, object]:
    """What a script reads back after saving into out/ckpt: every way of listing a directory."""
    return {
        "scandir": sorted((e.name, e.is_dir(), e.is_file()) for e in os.scandir("out")),
        "walk": [(d, sorted(ds), sorted(fs)) for d, ds, fs in os.walk("out")],
        "glob": sorted(glob.glob("out/**/*.pt", recursive=True)),
        "rglob": sorted(str(p) for p in Path("out").rglob("*.pt")),
        "iterdir": sorted(p.name for p in Path("out/ckpt").iterdir()),
        "statvfs": os.statvfs("out/ckpt").f_namemax > 0,
        "access": os.access("out/ckpt/model.pt", os.R_OK),
    }


def _save() -> None:
    os.makedirs("out/ckpt", exist_ok=True)
    Path("out/ckpt/model.pt").write_bytes(b"new")
    Path("out/ckpt/optim.pt").write_bytes(b"new")


def test_listings_see_the_held_back_writes_as_the_plain_file_system_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, overlaid = tmp_path / "plain", tmp_path / "overlaid"
    for root in (plain, overlaid):
        (root / "out").mkdir(parents=True)
        (root / "out" / "old.pt").write_bytes(b"the user's")
        (root / "out" / "notes.txt").write_text("keep")
    monkeypatch.chdir(plain)
    _save()
    os.remove("out/notes.txt")
    expected = _listings()
    monkeypatch.chdir(overlaid)
    with Overlay() as disk:
        _save()
        os.remove("out/notes.txt")  # hidden, not removed
        assert _listings() == expected
        assert {w.path for w in disk.held()} == {os.path.join("out", "ckpt", "model.pt"), os.path.join("out", "ckpt", "optim.pt")}
    disk.cleanup()
    assert sorted(os.listdir(overlaid / "out")) == ["notes.txt", "old.pt"]  # the user's directory as it was


def test_links_the_script_makes_are_held_back_and_read_as_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer pointing out/latest at its newest checkpoint (os.symlink), or keeping a hard link of it (os.link):
    plainly the link reads the checkpoint; under the overlay too, and neither link is made among the user's files."""
    def link_and_read() -> tuple[bytes, bytes]:
        os.makedirs("out", exist_ok=True)
        Path("out/ckpt-2.pt").write_bytes(b"step 2")
        os.symlink("ckpt-2.pt", "out/latest.pt")
        os.link("out/ckpt-2.pt", "out/kept.pt")
        return Path("out/latest.pt").read_bytes(), Path("out/kept.pt").read_bytes()

    (tmp_path / "plain").mkdir()
    (tmp_path / "overlaid").mkdir()
    monkeypatch.chdir(tmp_path / "plain")
    expected = link_and_read()
    monkeypatch.chdir(tmp_path / "overlaid")
    with Overlay() as disk:
        assert link_and_read() == expected == (b"step 2", b"step 2")
        assert {w.path for w in disk.held()} == {os.path.join("out", n) for n in ("ckpt-2.pt", "latest.pt", "kept.pt")}
    disk.cleanup()
    assert os.listdir(tmp_path / "overlaid") == []


def test_temporary_files_and_sockets_of_libraries_are_real_and_owned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """multiprocessing binds its socket in a tempfile.mkdtemp folder (multiprocessing/util.py get_temp_dir, then
    connection.py SocketListener: self._socket.bind(address)): bind is C code that sees the real file system."""
    monkeypatch.chdir(tmp_path)
    with Overlay() as disk:
        folder = tempfile.mkdtemp(prefix="pymp-")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(os.path.join(folder, "listener"))  # FileNotFoundError when the folder was only in scratch
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"a": 1}, f)
            f.flush()
            assert json.loads(Path(f.name).read_text()) == {"a": 1}
        with tempfile.TemporaryDirectory() as d:
            Path(d, "x.bin").write_bytes(b"1")
            assert os.listdir(d) == ["x.bin"]
        assert not os.path.exists(d)
        os.remove(os.path.join(folder, "listener"))
        os.rmdir(folder)
        assert not disk.held()
        fd, name = tempfile.mkstemp(dir=tmp_path, suffix=".tmp")  # a temporary name among the user's files: scratch
        os.close(fd)
        assert os.path.exists(name) and [w.path for w in disk.held()] == [os.path.basename(name)]
    disk.cleanup()
    assert not os.path.exists(name)


def test_load_dataset_into_a_cache_folder_that_does_not_exist_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """run_clm.py's shape (transformers examples): load_dataset(extension, data_files=..., cache_dir=model_args.cache_dir)
    on a fresh CI runner, where the cache folder is made by the load. The plain load makes it; the simulated one
    holds it back."""
    from datasets import load_dataset

    monkeypatch.chdir(tmp_path)
    Path("train.csv").write_text("text,label\nhello world,0\nbye now,1\n")
    Path("train.py").write_text(
        "import torch\nfrom datasets import load_dataset\n"
        "ds = load_dataset('csv', data_files='train.csv', cache_dir='./fresh/cache')['train']\n"
        "model = torch.nn.Linear(2, 2).cuda()\n"
        "model(torch.full((len(ds), 2), 1.0, device='cuda')).sum().backward()\n")
    assert len(load_dataset("csv", data_files="train.csv", cache_dir=str(tmp_path / "plain" / "cache"))["train"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        run(["run", "--simulate", "-f", "json", "--", "python", "train.py"])
    report = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0 and report["coverage"]["phases"]["backward"]
    assert not (tmp_path / "fresh").exists()
    assert any(w["path"].startswith(os.path.join("fresh", "cache")) for w in report["writes"])


def _copies() -> dict[str, object]:
    """A checkpoint copied and moved after saving, as scripts keep their best one (shutil.copytree /
    copy2 / move, which carry permissions, times and extended attributes over after the bytes)."""
    import shutil

    _save()
    shutil.copytree("out/ckpt", "best")
    shutil.copy2("out/ckpt/model.pt", "best/model-copy.pt")
    shutil.move("best", "final")
    return {"final": sorted(os.listdir("final")), "best": os.path.exists("best"),
            "bytes": Path("final/model-copy.pt").read_bytes()}


def test_copies_and_moves_of_held_back_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, overlaid = tmp_path / "plain", tmp_path / "overlaid"
    plain.mkdir(), overlaid.mkdir()
    monkeypatch.chdir(plain)
    expected = _copies()
    assert expected["final"] == ["model-copy.pt", "model.pt", "optim.pt"]  # the plain file system
    monkeypatch.chdir(overlaid)
    with Overlay() as disk:
        assert _copies() == expected  # failed with ENOENT at os.listxattr before extended attributes went through it
        assert {w.path for w in disk.held()} >= {os.path.join("final", "model.pt"), os.path.join("final", "model-copy.pt")}
    disk.cleanup()
    assert list(overlaid.iterdir()) == []  # nothing written among the user's files


@pytest.mark.parametrize("home", [True, False], ids=["HF_HOME-too", "datasets-cache-alone"])
def test_a_cache_folder_that_does_not_exist_yet_is_made_as_the_plain_script_makes_it(
        home: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets' builder on a fresh runner: os.makedirs(HF_DATASETS_CACHE), then a FileLock in it. Under the
    overlay the cache's missing parent (`.hf-home`, not a cache itself when HF_HOME is unset) once stopped
    makedirs, and a lock refused by the net made filelock wait forever."""
    from filelock import FileLock

    def builder(root: Path) -> bool:
        cache = root / ".hf-home" / "datasets"
        os.makedirs(cache, exist_ok=True)
        with FileLock(str(cache / "builder.lock"), timeout=5):
            (cache / "arrow").mkdir(exist_ok=True)
        return cache.is_dir()

    assert builder(tmp_path / "plain")
    root = tmp_path / "overlaid"
    root.mkdir()
    if home:
        monkeypatch.setenv("HF_HOME", str(root / ".hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(root / ".hf-home" / "datasets"))
    monkeypatch.chdir(root)
    with Overlay() as disk:
        assert builder(root)
    disk.cleanup()
    assert (root / ".hf-home" / "datasets" / "arrow").is_dir()  # a library cache, written as it is


def _compiled_writers() -> dict[str, object]:
    """Writers in compiled code that open the path themselves, none through Python's open: after its step a
    script saves a TorchScript model over its old one, logs to an SQLite file, writes its predictions with
    pandas (pyarrow's OSFile) and as feather, binds a control socket and a FIFO in its run folder."""
    import sqlite3

    import pandas as pd
    import pyarrow.feather as feather
    import torch

    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), "run/model.pt")
    with sqlite3.connect("run/log.db") as db:
        db.execute("insert into steps values (2)")
    rows = sqlite3.connect("run/log.db").execute("select count(*) from steps").fetchone()[0]
    pd.DataFrame({"p": [0.5]}).to_parquet("run/pred.parquet")
    feather.write_feather(pd.DataFrame({"p": [0.5]}), "run/pred.feather")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind("run/ctl.sock")
        server.listen(1)
        client.connect("run/ctl.sock")
    os.mkfifo("run/events")
    return {"model": type(torch.jit.load("run/model.pt")).__name__, "rows": rows,
            "pred": pd.read_parquet("run/pred.parquet")["p"].tolist(), "feather": feather.read_feather("run/pred.feather")["p"].tolist(),
            "listed": sorted(os.listdir("run"))}


def test_writers_in_compiled_code_are_held_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's audit hook never sees these opens (C++, SQLite, Arrow, the socket's bind): before, each wrote the
    user's run folder under --simulate (a TorchScript save replaced the user's model.pt)."""
    import sqlite3

    plain, overlaid = tmp_path / "plain", tmp_path / "overlaid"
    for root in (plain, overlaid):
        (root / "run").mkdir(parents=True)
        (root / "run" / "model.pt").write_bytes(b"the user's model")
        with sqlite3.connect(root / "run" / "log.db") as db:
            db.execute("create table steps (n)")
            db.execute("insert into steps values (1)")
    before = {p.name: p.read_bytes() for p in (overlaid / "run").iterdir()}
    monkeypatch.chdir(plain)
    expected = _compiled_writers()
    assert expected["rows"] == 2 and (plain / "run" / "ctl.sock").is_socket()  # the plain run wrote the user's folder
    monkeypatch.chdir(overlaid)
    with Overlay() as disk:
        assert _compiled_writers() == expected
        held = {w.path for w in disk.held()}
    disk.cleanup()
    assert {os.path.join("run", n) for n in ("model.pt", "log.db", "pred.parquet", "pred.feather", "ctl.sock", "events")} <= held
    assert {p.name: p.read_bytes() for p in (overlaid / "run").iterdir()} == before  # the user's folder as it was
