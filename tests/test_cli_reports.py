"""Where the CLI's reports go and what it says meanwhile: several outputs from one run, progress on
a terminal and on a pipe, --quiet and --verbose, NO_COLOR and FORCE_COLOR, suppressions and a
baseline from the command line, and the pipeline named in [tool.dtype-doctor].

The planning and the progress reporter are checked as units; each end-to-end case runs one demo
scan (the demo model is a tiny ResNet), in-process unless what is checked is a real pipe.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run
from dtype_doctor.cli.output import Destination, Stages, plan_outputs, quiet_libraries, wants_color

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "fixtures" / "demo"
FORMATS = ("rich", "github", "json", "junit", "markdown", "sarif")
STAGE = re.compile(r"^dtype-doctor: \[(\d+\.\d) s\] (.+)$")


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        run([str(a) for a in argv])
    out, err = capsys.readouterr()
    return done.value.code, out, err


# ----------------------------------------------------------------------------- where reports go


@pytest.mark.parametrize(
    "fmt, outputs, terminal, stdout, files",
    [
        (None, [], False, "rich", []),
        ("json", [], False, "json", []),
        ("sarif", ["out.json"], False, None, [("sarif", "out.json")]),  # one --output with --format: as before
        (None, ["r.json", "r.sarif", "r.xml", "r.md", "r.txt"], False, None,
         [("json", "r.json"), ("sarif", "r.sarif"), ("junit", "r.xml"), ("markdown", "r.md"), ("rich", "r.txt")]),
        (None, ["r.json", "r.sarif"], True, "rich", [("json", "r.json"), ("sarif", "r.sarif")]),  # the console beside
        ("github", ["r.json", "sarif:dd.out"], False, "github", [("json", "r.json"), ("sarif", "dd.out")]),
        (None, ["json:-", "r.sarif"], True, "json", [("sarif", "r.sarif")]),
        ("json", ["report", "r.sarif"], False, None, [("json", "report"), ("sarif", "r.sarif")]),
    ],
)
def test_plan_outputs(fmt, outputs, terminal, stdout, files) -> None:
    plan = plan_outputs(fmt, outputs, FORMATS, stdout_is_terminal=terminal)
    assert (plan.stdout.format if plan.stdout else None) == stdout
    assert [(d.format, str(d.path)) for d in plan.files] == files


def test_a_typo_in_a_format_prefix_is_refused_and_a_colon_in_a_name_is_not() -> None:
    from dtype_doctor.records.errors import UsageError

    with pytest.raises(UsageError, match="did you mean 'sarif'"):
        plan_outputs(None, ["sairf:x.sarif"], FORMATS)
    plan = plan_outputs(None, ["run:2024.json"], FORMATS)
    assert plan.files == (Destination("json", Path("run:2024.json")),)


def test_one_run_writes_every_output_and_the_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    code, out, err = cli(capsys, "scan", DEMO / "model", DEMO / "data", "--format", "github",
                         "-o", tmp_path / "r.json", "-o", tmp_path / "r.sarif", "-o", f"junit:{tmp_path / 'junit.out'}",
                         "-o", tmp_path / "r.md", "--plot", tmp_path / "ranges.png")
    assert code == 1
    assert out.startswith("::error ") and "title=DD101" in out  # --format names no file: stdout gets it
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["error"] == 1
    sarif = json.loads((tmp_path / "r.sarif").read_text())  # validated by conftest, GitHub's rules too
    assert [r["ruleId"] for r in sarif["runs"][0]["results"]] == ["DD101"]
    assert ET.fromstring((tmp_path / "junit.out").read_text()).tag in ("testsuites", "testsuite")
    md = (tmp_path / "r.md").read_text()
    assert "![" in md and "](ranges.png)" in md  # linked from the markdown's own folder
    assert (tmp_path / "ranges.png").read_bytes()[:4] == b"\x89PNG"
    written = [line for line in err.splitlines() if not STAGE.match(line)]
    assert sorted(written) == sorted([f"plot written to {tmp_path / 'ranges.png'}"] +
                                     [f"report written to {tmp_path / n}" for n in ("r.json", "r.sarif", "junit.out", "r.md")])


def test_outputs_are_refused_before_anything_loads_when_they_collide(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(capsys, "scan", DEMO / "model", DEMO / "data", "-o", tmp_path / "a.json", "-o", f"json:{tmp_path / 'a.json'}")
    assert code == 2 and "name the same file" in err and len(err.splitlines()) == 1
    code, _, err = cli(capsys, "scan", DEMO / "model", DEMO / "data", "--plot", DEMO / "model" / "plot.svg")
    assert code == 2 and "which this command reads" in err


# ----------------------------------------------------------------------------- what is said meanwhile


def test_stages_on_a_pipe_are_one_line_each_with_elapsed_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    say = Stages(terminal=False)
    say("loading model m")
    say("tracing")
    say.close()
    lines = capsys.readouterr().err.splitlines()
    assert [STAGE.match(line).group(2) for line in lines] == ["loading model m", "tracing"]
    quiet = Stages(terminal=False, quiet=True)
    quiet("loading model m")
    quiet.close()
    assert capsys.readouterr().err == ""


def test_stages_on_a_terminal_keep_each_finished_stage_with_its_time(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    say = Stages(terminal=True)
    say("loading model m")
    say("tracing")
    say.close()
    err = capsys.readouterr().err
    assert re.search(r"✓ loading model m \d+\.\d s", err) and re.search(r"✓ tracing \d+\.\d s", err)


def test_colour_follows_no_color_and_force_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    assert wants_color(Tty()) and not wants_color(sys.stdout)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert wants_color(sys.stdout)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color(Tty()) and not wants_color(sys.stdout)


def test_the_libraries_are_held_back_unless_verbose() -> None:
    import transformers

    names = ("bitsandbytes", "torchao", "accelerate")
    before = {n: logging.getLogger(n).level for n in names}
    verbosity = transformers.utils.logging.get_verbosity()
    try:
        quiet_libraries()
        assert all(logging.getLogger(n).level == logging.ERROR for n in names)
        assert transformers.utils.logging.get_verbosity() == logging.ERROR
        for n in names:
            logging.getLogger(n).setLevel(logging.NOTSET)
        transformers.utils.logging.set_verbosity(logging.INFO)
        quiet_libraries(verbose=True)
        assert all(logging.getLogger(n).level == logging.NOTSET for n in names)
        assert transformers.utils.logging.get_verbosity() == logging.INFO
    finally:
        for n, level in before.items():
            logging.getLogger(n).setLevel(level)
        transformers.utils.logging.set_verbosity(verbosity)


def _piped(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100", **(env or {})}
    for name in ("NO_COLOR", "FORCE_COLOR"):
        if name not in (env or {}):
            full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "dtype_doctor", *argv], capture_output=True, text=True, env=full,
                          cwd=REPO, timeout=300)


def test_piped_output_in_a_real_process() -> None:
    """CI's view: stdout the report (coloured only with FORCE_COLOR), stderr one line per stage as it
    starts with the seconds so far, in order; with --quiet and NO_COLOR nothing but the report."""
    proc = _piped("scan", "fixtures/demo/model", "fixtures/demo/data", env={"FORCE_COLOR": "1"})
    assert proc.returncode == 1 and "\x1b[" in proc.stdout and "DD101" in proc.stdout
    stages = [STAGE.match(line) for line in proc.stderr.splitlines()]
    assert all(stages), proc.stderr
    said = [m.group(2) for m in stages]
    assert said[0] == "importing torch and transformers" and said[-1] == "tracing"
    assert any(s.startswith("loading model") for s in said) and any(s.startswith("reading 2 row(s)") for s in said)
    seconds = [float(m.group(1)) for m in stages]
    assert seconds == sorted(seconds) and seconds[0] < seconds[-1]
    quiet = _piped("scan", "fixtures/demo/model", "fixtures/demo/data", "-q", env={"NO_COLOR": "1"})
    assert quiet.returncode == 1 and quiet.stderr == "" and "\x1b[" not in quiet.stdout and "DD101" in quiet.stdout


# ----------------------------------------------------------------------------- suppressions from the command line


def test_a_source_comment_and_a_baseline_from_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prep = tmp_path / "prep.py"
    lines = (DEMO / "prep.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines) if "torch.float16" in text)
    lines[line] += "  # dtype-doctor: ignore[DD101]"
    prep.write_text("\n".join(lines) + "\n")
    code, out, _ = cli(capsys, "scan", DEMO / "model", DEMO / "data", "--preprocess", f"{prep}:preprocess", "-f", "json", "-q")
    report = json.loads(out)
    assert code == 0 and report["findings"] == []
    assert report["suppressed"]["comment"] == 1 and report["suppressed"]["findings"][0]["source"]["line"] == line + 1
    # Without the comment: a baseline written by one run holds the finding in the next.
    baseline = tmp_path / "baseline.json"
    code, out, err = cli(capsys, "scan", DEMO / "model", DEMO / "data", "--write-baseline", baseline, "-q")
    assert code == 0 and json.loads(baseline.read_text())["findings"][0]["code"] == "DD101"
    code, out, _ = cli(capsys, "scan", DEMO / "model", DEMO / "data", "--baseline", baseline, "-f", "json", "-q")
    report = json.loads(out)
    assert code == 0 and report["findings"] == [] and report["suppressed"] == {
        "total": 1, "comment": 0, "baseline": 1, "findings": report["suppressed"]["findings"]}
    code, out, _ = cli(capsys, "scan", DEMO / "model", DEMO / "data", "-f", "json", "-q")
    assert code == 1 and json.loads(out)["findings"][0]["fingerprint"] == report["suppressed"]["findings"][0]["fingerprint"]


# ----------------------------------------------------------------------------- the project's check in its config


def test_a_bare_scan_runs_the_pipeline_named_in_pyproject(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("model", "data", "prep.py"):
        (shutil.copytree if name != "prep.py" else shutil.copy)(DEMO / name, tmp_path / name)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.dtype-doctor]\nmodel = "model"\ndataset = "data"\npreprocess = "prep.py:preprocess"\n'
        'output = ["dd.out"]\nquiet = true\n[tool.dtype-doctor.scan]\nformat = "json"\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, "scan")
    assert code == 1 and err == ""
    report = json.loads((tmp_path / "dd.out").read_text())  # one --output with --format json: json in it
    assert report["findings"][0]["source"]["file"] == "prep.py" and out == ""
    code, out, _ = cli(capsys, "scan", "model", "data", "--preprocess", "prep.py:preprocess", "-o", "-")
    assert code == 1 and json.loads(out)["target"]["model"] == "model"  # the command line wins


def test_the_script_key_is_runs_command(tmp_path: Path) -> None:
    from dtype_doctor.cli.config import default_map

    (tmp_path / "dd.toml").write_text('script = "train.py --epochs 1"\n[run]\nsteps = 2\n[fix]\nscript = "pipeline.py"\n')
    params = {"run": {"command": "argument", "steps": "option"}, "fix": {"script": "option"}, "scan": {"model": "argument"}}
    got = default_map(["run", "--config", str(tmp_path / "dd.toml")], lambda: params)
    assert got == {"run": {"command": ["python", "train.py", "--epochs", "1"], "steps": 2}, "fix": {"script": "pipeline.py"}}
    (tmp_path / "dd.toml").write_text('script = "torchrun --nproc-per-node 2 train.py"\n')
    assert default_map(["run", "--config", str(tmp_path / "dd.toml")], lambda: params)["run"]["command"][0] == "torchrun"
