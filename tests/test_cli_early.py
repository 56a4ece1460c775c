"""Command-line mistakes are refused before torch is imported: one line on stderr, exit 2, a near
name offered where there is one.

Each case runs the real entry point in a fresh process; an exit hook in that process writes
which of torch, transformers, datasets and numpy it imported (from `sys.modules`, as the process
ends), so "before torch" is read from the process itself, not inferred from timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BERT = "fixtures/models/bert-tiny"
TEXT = "fixtures/data/text-cls"
HEAVY = ("torch", "transformers", "datasets", "numpy")
COMMAND_MODULES = tuple(f"dtype_doctor.cli.{m}" for m in ("scan", "fix", "compare", "run", "rules", "init"))
PROBE = """
import atexit, json, sys
atexit.register(lambda: open(sys.argv[1], "w").write(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules))))
atexit.register(lambda: open(sys.argv[1] + ".cli", "w").write(json.dumps(sorted(m for m in {commands!r} if m in sys.modules))))
from dtype_doctor.cli.main import run
run(sys.argv[2:])
""".format(heavy=HEAVY, commands=COMMAND_MODULES)


def early(tmp_path: Path, *argv: str) -> tuple[int, str, str, list[str]]:
    """(exit code, stdout, stderr, heavy modules imported) of `dtype-doctor ARGV` in a fresh process."""
    seen = tmp_path / "imported.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(seen), *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr, json.loads(seen.read_text())


def fifo(tmp_path: Path) -> str:
    path = tmp_path / "rows.csv"
    os.mkfifo(path)
    return str(path)


CASES = {
    # paths
    "missing-model": (lambda t: ["scan", "/nonexistent/model-dir", TEXT], ("/nonexistent/model-dir", "no such")),
    "model-typo": (lambda t: ["scan", "fixtures/models/bert-tni", TEXT], ("did you mean 'fixtures/models/bert-tiny'",)),
    "model-not-cached": (lambda t: ["scan", "no-such-org/no-such-model", TEXT], ("not in the Hugging Face cache",)),
    "model-is-a-file": (lambda t: ["scan", f"{BERT}/config.json", TEXT], ("is a file", "model directory")),
    "model-is-a-device": (lambda t: ["scan", "/dev/null", TEXT], ("/dev/null is a device",)),
    "missing-dataset": (lambda t: ["scan", BERT, "/nonexistent/data-dir"], ("/nonexistent/data-dir",)),
    "dataset-typo": (lambda t: ["scan", BERT, "fixtures/data/text-cls.csb"], ("did you mean 'fixtures/data/text-cls.csv'",)),
    "dataset-not-cached": (lambda t: ["scan", BERT, "no-such-org/no-such-data"], ("not in the Hugging Face cache",)),
    "dataset-is-a-fifo": (lambda t: ["scan", BERT, fifo(t)], ("named pipe (FIFO)",)),
    "preprocess-missing": (lambda t: ["scan", BERT, TEXT, "--preprocess", "/nonexistent/prep.py:f"], ("/nonexistent/prep.py",)),
    "preprocess-no-function": (lambda t: ["scan", BERT, TEXT, "--preprocess", "fixtures/demo/prep.py"], ("FILE.py:FUNC",)),
    "script-missing": (lambda t: ["run", "--", "python", "/nonexistent/train.py"], ("/nonexistent/train.py",)),
    "fix-script-missing": (lambda t: ["fix", BERT, TEXT, "--script", "/nonexistent/train.py"], ("/nonexistent/train.py",)),
    "output-under-a-file": (lambda t: ["scan", BERT, TEXT, "-o", f"{BERT}/config.json/r.json"], ("cannot write the report",)),
    "baseline-missing": (lambda t: ["scan", BERT, TEXT, "--baseline", "/nonexistent/baseline.json"], ("/nonexistent/baseline.json",)),
    # options and values
    "unknown-option": (lambda t: ["scan", BERT, TEXT, "--batchsize", "3"], ("--batchsize", "did you mean --batch-size")),
    "bad-gpu": (lambda t: ["scan", BERT, TEXT, "--simulate", "--gpu", "a1000"], ("'a1000'", "did you mean 'a100'")),
    "bad-dtype": (lambda t: ["scan", BERT, TEXT, "--dtype", "flaot16"], ("'flaot16'", "did you mean 'float16'")),
    "bad-autocast": (lambda t: ["scan", BERT, TEXT, "--autocast", "bf61"], ("--autocast",)),
    "bad-device": (lambda t: ["scan", BERT, TEXT, "--device", "cdua"], ("'cdua'", "did you mean 'cuda'")),
    "bad-format": (lambda t: ["scan", BERT, TEXT, "--format", "jsno"], ("did you mean 'json'",)),
    "bad-output-format": (lambda t: ["scan", BERT, TEXT, "-o", "sairf:x.sarif"], ("did you mean 'sarif'",)),
    "bad-plot-suffix": (lambda t: ["scan", BERT, TEXT, "--plot", str(t / "ranges.pdf")], ("--plot", ".svg or .png")),
    "batch-size-0": (lambda t: ["scan", BERT, TEXT, "--batch-size", "0"], ("--batch-size",)),
    "bad-strategy": (lambda t: ["fix", BERT, TEXT, "--strategy", "autocats"], ("did you mean 'autocast'",)),
    "bad-fail-on": (lambda t: ["run", "--fail-on", "warn", "--", "python", "x.py"], ("--fail-on", "did you mean 'warning'")),
    "run-bad-gpu": (lambda t: ["run", "--simulate", "--gpu", "h10", "--", "python", "x.py"], ("did you mean 'h100'",)),
    "compare-bad-row": (lambda t: ["compare", BERT, TEXT, "--rows", "halff"], ("halff",)),
    # rules
    "unknown-code": (lambda t: ["scan", BERT, TEXT, "--select", "DD1O1"], ("DD1O1", "did you mean 'DD101'")),
    "unknown-ignore": (lambda t: ["scan", BERT, TEXT, "--ignore", "XX1"], ("XX1", "known rules")),
    "unknown-rule": (lambda t: ["rule", "DD1O1"], ("did you mean 'DD101'",)),
    "unknown-rule-name": (lambda t: ["rule", "dtype-mismatch-in-ops"], ("did you mean 'dtype-mismatch-in-op'",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_command_line_mistake_is_one_line_before_torch(tmp_path: Path, case: str) -> None:
    build, needles = CASES[case]
    code, out, err, heavy = early(tmp_path, *build(tmp_path))
    assert code == 2 and out == "", (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtype-doctor: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert heavy == [], f"{case} imported {heavy} before refusing"


def test_dtype_aliases_are_accepted(tmp_path: Path) -> None:
    from dtype_doctor.cli import options as o

    for alias, name in (("fp16", "float16"), ("half", "float16"), ("bf16", "bfloat16"), ("fp32", "float32"), ("FP16", "float16")):
        opts = o.scan_options(o.Batch(), o.Loading(dtype=alias, load_in_4bit=True, bnb_compute_dtype=alias if alias != "half" else "fp16"), o.Machine(), o.Step(autocast="bf16"),
                              o.Findings(), o.General())
        assert (opts.dtype, opts.autocast) == (name, "bfloat16")
        opts.validate()
    # and an alias reaches the engine from the command line, refused only for what it is
    code, _, err, heavy = early(tmp_path, "scan", BERT, TEXT, "--dtype", "bf16", "--autocast", "fp16", "--batch-size", "0")
    assert code == 2 and "--batch-size" in err and heavy == []


def test_the_timeouts_fit_what_they_limit() -> None:
    """A --preprocess function gets a minute (a few rows); a script keeps run's 300 s."""
    from dtype_doctor.cli import options as o

    assert o.scan_options(o.Batch(), o.Loading(), o.Machine(), o.Step(), o.Findings(), o.General()).timeout == 60
    assert o.run_options(o.Machine(), o.Findings(), o.General(), steps=1).timeout == 300
    assert o.scan_options(o.Batch(), o.Loading(), o.Machine(), o.Step(), o.Findings(), o.General(timeout=5)).timeout == 5


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [(["--help"], []), ([], []), (["scan", "--help"], ["dtype_doctor.cli.scan"]), (["fix", "-h"], ["dtype_doctor.cli.fix"]),
     (["scan", BERT, TEXT, "--batch-size", "0"], ["dtype_doctor.cli.scan"]), (["rules"], ["dtype_doctor.cli.rules"])],
    ids=["help", "bare", "scan-help", "fix-help", "scan-early-error", "rules"],
)
def test_only_the_command_asked_for_is_loaded(tmp_path: Path, argv: list[str], loaded: list[str]) -> None:
    """`dtype-doctor --help` lists every command without importing one; a command's help or early error
    imports that command's module and no other (docs/commands/: each command is loaded when asked for)."""
    code, out, err, heavy = early(tmp_path, *argv)
    assert code in (0, 2) and heavy == [], (code, err)
    assert json.loads((tmp_path / "imported.json.cli").read_text()) == loaded
    if argv in (["--help"], []):
        listing = out or err
        for name in ("scan", "fix", "compare", "run", "rule", "rules", "init"):
            assert f"\n  {name} " in listing, listing
