"""The user's files: an output never names an input, and a failed write never destroys a file.

Overlaps are refused (exit 2, one line) before anything loads, with every file hashed before and
after. The failed write is real: a subprocess under RLIMIT_FSIZE, whose report cannot be
written, leaves the previous report byte for byte."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.records.errors import UsageError
from dtype_doctor.records.files import write_atomic
from tests.test_cli_bad_input import DEMO_DATA, DEMO_MODEL, assert_one_error_line, run_cli, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
PREP = "def prep(row):\n    return row\n"


@pytest.fixture
def user(tmp_path: Path) -> dict[str, Path]:
    model, data = tmp_path / "model", tmp_path / "data"
    shutil.copytree(DEMO_MODEL, model)
    shutil.copytree(DEMO_DATA, data)
    prep = tmp_path / "prep.py"
    prep.write_text(PREP)
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    cfg = tmp_path / "dd.toml"
    cfg.write_text("batch-size = 2\n")
    return {"model": model, "data": data, "prep": prep, "script": script, "config": cfg, "tmp": tmp_path}


def some_file(d: Path) -> Path:
    return sorted(p for p in d.rglob("*") if p.is_file())[0]


OVERLAPS = {
    "output-is-config.json": lambda u: ["scan", str(u["model"]), str(u["data"]), "-o", str(u["model"] / "config.json")],
    "output-is-a-dataset-file": lambda u: ["scan", str(u["model"]), str(u["data"]), "-o", str(some_file(u["data"]))],
    "output-new-file-in-dataset-dir": lambda u: ["scan", str(u["model"]), str(u["data"]), "-o", str(u["data"] / "r.json")],
    "output-is-preprocess": lambda u: ["scan", str(u["model"]), str(u["data"]), "--preprocess", f"{u['prep']}:prep",
                                       "-o", str(u["prep"])],
    "output-is-config-file": lambda u: ["scan", str(u["model"]), str(u["data"]), "--config", str(u["config"]),
                                        "-o", str(u["config"])],
    "compare-output-is-weights": lambda u: ["compare", str(u["model"]), str(u["data"]), "-o", str(some_file(u["model"]))],
    "patch-is-preprocess-with-force": lambda u: ["fix", str(u["model"]), str(u["data"]), "--preprocess", f"{u['prep']}:prep",
                                                 "--write-patch", str(u["prep"]), "--force"],
    "patch-is-script": lambda u: ["fix", str(u["model"]), str(u["data"]), "--script", str(u["script"]),
                                  "--write-patch", str(u["script"]), "--force"],
    "patch-and-output-same-file": lambda u: ["fix", str(u["model"]), str(u["data"]), "--write-patch", str(u["tmp"] / "x"),
                                             "-o", str(u["tmp"] / "x")],
    "run-output-is-the-script": lambda u: ["run", "-o", str(u["script"]), "--", "python", str(u["script"])],
    "fix-run-patch-is-the-script": lambda u: ["fix", "--run", "--write-patch", str(u["script"]), "--force", "--",
                                              "python", str(u["script"])],
}


@pytest.mark.parametrize("case", sorted(OVERLAPS))
def test_an_output_naming_an_input_is_refused_and_nothing_changes(case: str, user: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = OVERLAPS[case](user)
    before = tree_hash(user["tmp"])
    code, out, err = run_cli(capsys, argv)
    assert code == 2, err
    assert_one_error_line(err, "write it somewhere else" if "same-file" not in case else "same file")
    assert out == ""
    assert tree_hash(user["tmp"]) == before


def test_write_atomic_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text("old")
    f.chmod(0o640)
    write_atomic(f, "new")
    assert f.read_text() == "new" and (f.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left behind
    with pytest.raises(UsageError, match="already exists"):
        write_atomic(f, "newer", exclusive=True, what="the patch")
    assert f.read_text() == "new"


def _fsize_limit(limit: int):  # noqa: ANN202 - a preexec_fn
    def apply() -> None:
        # Ignored, SIGXFSZ turns into EFBIG on the write that passes the limit (it would kill the process).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_report_write_that_fails_leaves_the_previous_report_byte_for_byte(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    previous = b'{"previous": "report"}\n' * 10  # 230 bytes: under the limit, the new report is not
    report.write_bytes(previous)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "scan", str(DEMO_MODEL), str(DEMO_DATA), "--format", "json", "-o", str(report)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, preexec_fn=_fsize_limit(1024),
    )
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr, "cannot write the report", str(report))
    assert report.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # the temporary file is gone too
    # The same write without the limit replaces it whole.
    proc = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "scan", str(DEMO_MODEL), str(DEMO_DATA), "--format", "json", "-o", str(report)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    assert report.read_bytes().startswith(b'{\n  "schema_version": 1')


def test_write_atomic_keeps_a_symlink_and_writes_into_a_stream(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    write_atomic(fifo, "streamed")
    assert reader.communicate(timeout=30)[0] == "streamed"
    assert stat_is_fifo(fifo)


def stat_is_fifo(p: Path) -> bool:
    import stat

    return stat.S_ISFIFO(p.stat().st_mode)
