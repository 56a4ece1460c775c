"""--config PATH and [tool.dtype-doctor] in pyproject.toml: defaults for options, the command line wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

ROOT = Path(__file__).resolve().parents[1]
DEMO = [str(ROOT / "fixtures/demo/model"), str(ROOT / "fixtures/demo/data")]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        run(argv)
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_pyproject_table_sets_defaults_and_the_command_line_wins(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.dtype-doctor]\nformat = "json"\nfail-on = "never"\nselect = ["DD1", "DD2"]\n'
    )
    code, out, _ = _run(["scan", *DEMO], capsys)
    report = json.loads(out)  # format from the file
    assert code == 0 and [f["code"] for f in report["findings"]] == ["DD101"]  # fail-on never
    code, out, _ = _run(["scan", *DEMO, "--fail-on", "error", "--select", "DD3"], capsys)
    assert code == 0 and json.loads(out)["findings"] == []  # the command line's --select won
    code, _, _ = _run(["scan", *DEMO, "--fail-on", "error"], capsys)
    assert code == 1


def test_a_command_table_and_an_explicit_file(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "dd.toml").write_text('fail-on = "never"\n[scan]\nformat = "github"\n')
    code, out, _ = _run(["scan", *DEMO, "--config", "dd.toml"], capsys)
    assert code == 0 and out.startswith("::error ") and "title=DD101" in out
    (here / "dd.toml").write_text('[tool.dtype-doctor.fix]\nformat = "json"\n')
    code, out, _ = _run(["scan", *DEMO, "--config=dd.toml"], capsys)
    assert code == 1 and not out.startswith("{")  # the fix table leaves scan alone


@pytest.mark.parametrize(
    "text, says",
    [
        ('batchsize = 3\n', "unknown option 'batchsize'"),
        ('[tool.dtype-doctor.scna]\ndtype = "float16"\n', "unknown command table [scna]"),
        ('[tool.dtype-doctor.run]\nbatch-size = 3\n', "run has no option 'batch-size'"),
        ('fail-on = \n', "is not valid TOML"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(text: str, says: str, here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "dd.toml").write_text(text)
    code, out, err = _run(["scan", *DEMO, "--config", "dd.toml"], capsys)
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_and_a_pyproject_without_the_table(here: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = _run(["scan", *DEMO, "--config", "nope.toml"], capsys)
    assert code == 2 and "no such file" in err
    (here / "pyproject.toml").write_text('[project]\nname = "x"\n')
    code, out, _ = _run(["scan", *DEMO], capsys)
    assert code == 1 and "DD101" in out


def test_run_reads_no_config_option_after_the_double_dash(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "script.py").write_text("import sys\nprint('args', sys.argv[1:], file=sys.stderr)\n")
    code, _, err = _run(["run", "--", "python", "script.py", "--config", "nope.toml"], capsys)
    # The script's own --config reached it, untouched; it calls no model, which run says (exit 2).
    assert "args ['--config', 'nope.toml']" in err and code == 2 and "without calling a model" in err
