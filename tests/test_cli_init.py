"""`dtype-doctor init`: the files it writes, what it finds, what it refuses to touch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FILES = (".pre-commit-config.yaml", ".github/workflows/dtype-doctor.yml")


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _init(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        run(["init", *args])
    return done.value.code, capsys.readouterr().err


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _readme_yaml(key: str) -> list[str]:
    return [b for b in re.findall(r"^```yaml\n(.*?)^```", README, re.M | re.S) if re.search(rf"^{key}:", b, re.M)]


def test_the_readme_command_writes_what_the_readme_shows(here: Path, capsys: pytest.CaptureFixture) -> None:
    command = re.search(r"^dtype-doctor init .*$", README, re.M).group(0).split()[2:]
    original = b'[project]\nname = "mine"  # a comment init keeps\n\n[tool.ruff]\nline-length = 100\n'
    (here / "pyproject.toml").write_bytes(original)
    code, err = _init(command, capsys)
    assert code == 0, err
    text = (here / "pyproject.toml").read_bytes()
    assert text.startswith(original)  # byte for byte, the table after it
    config = tomllib.loads(text.decode())
    assert config["tool"]["dtype-doctor"] == {"fail-on": "error"} and config["tool"]["ruff"] == {"line-length": 100}
    pre_commit = (here / FILES[0]).read_text()
    assert pre_commit.split("repos:", 1)[1] == next(b for b in _readme_yaml("repos") if "repo: local" in b).split("repos:", 1)[1]
    assert (here / FILES[1]).read_text() == _readme_yaml("jobs")[0]
    assert "edit `uses: OWNER/dtype-doctor@v" in err  # the placeholder is said, not hidden


def test_it_refuses_to_overwrite_without_force(here: Path, capsys: pytest.CaptureFixture) -> None:
    assert _init(["--model", "m", "--dataset", "d"], capsys)[0] == 0
    (here / FILES[0]).write_text("repos: []  # mine\n")
    before = _snapshot(here)
    code, err = _init(["--model", "other", "--dataset", "d"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "dtype-doctor: error: .pre-commit-config.yaml, .github/workflows/dtype-doctor.yml already there; nothing written (--force replaces it)"
    ]
    assert _snapshot(here) == before
    code, err = _init(["--model", "other", "--dataset", "d", "--force"], capsys)
    assert code == 0 and '"scan", "other", "d"' in (here / FILES[0]).read_text()
    assert "already has [tool.dtype-doctor]; left as it is" in err
    assert (here / "pyproject.toml").read_text().count("[tool.dtype-doctor]") == 1
    assert sorted(p.name for p in here.rglob("*.tmp")) == []  # no temporary file left behind


def test_it_finds_the_model_and_the_dataset_nearest_it(here: Path, capsys: pytest.CaptureFixture) -> None:
    for folder, files in {
        "tools/lint": {"config.json": '{"indent": 2}'},  # a config.json that is no model's
        "exp/model": {"config.json": '{"model_type": "bert"}'},
        "exp/data/train": {"dataset_info.json": "{}", "state.json": "{}"},
        "aaa/data": {"dataset_info.json": "{}", "state.json": "{}"},  # shallower by name, farther from the model
        ".venv/lib/m": {"config.json": '{"model_type": "gpt2"}'},  # never looked in
    }.items():
        for name, text in files.items():
            (here / folder).mkdir(parents=True, exist_ok=True)
            (here / folder / name).write_text(text)
    code, err = _init([], capsys)
    assert code == 0, err
    assert 'args: ["scan", "exp/model", "exp/data/train"]' in (here / FILES[0]).read_text()
    assert "model: exp/model\n          dataset: exp/data/train\n" in (here / FILES[1]).read_text()


def test_a_training_script_is_checked_with_run(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "scripts").mkdir()
    (here / "scripts" / "train_lm.py").write_text("print('hi')\n")
    assert _init([], capsys)[0] == 0
    assert 'args: ["run", "--", "python", "scripts/train_lm.py"]' in (here / FILES[0]).read_text()
    assert "command: run\n          script: python scripts/train_lm.py\n" in (here / FILES[1]).read_text()


def test_nothing_found_is_a_placeholder_said_on_stderr(here: Path, capsys: pytest.CaptureFixture) -> None:
    code, err = _init(["--gpu", "t4"], capsys)
    assert code == 0
    assert "no model and dataset or training script found: edit path/to/model and path/to/dataset" in err
    assert '"scan", "path/to/model", "path/to/dataset"' in (here / FILES[0]).read_text()
    assert "gpu: t4\n" in (here / FILES[1]).read_text()
    assert tomllib.loads((here / "pyproject.toml").read_text())["tool"]["dtype-doctor"]["fail-on"] == "error"


def test_a_pyproject_without_a_final_newline_keeps_its_last_line(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "pyproject.toml").write_bytes(b'[project]\nname = "x"')
    assert _init(["--model", "m", "--dataset", "d"], capsys)[0] == 0
    text = (here / "pyproject.toml").read_text()
    assert text.startswith('[project]\nname = "x"\n\n[tool.dtype-doctor]\n') and tomllib.loads(text)["project"] == {"name": "x"}


def test_an_invalid_pyproject_is_refused_and_nothing_is_written(here: Path, capsys: pytest.CaptureFixture) -> None:
    (here / "pyproject.toml").write_text("[project\nname = 1\n")
    before = _snapshot(here)
    code, err = _init(["--model", "m", "--dataset", "d"], capsys)
    assert code == 2 and err.startswith("dtype-doctor: error: pyproject.toml is not valid TOML") and len(err.splitlines()) == 1
    assert _snapshot(here) == before


def test_an_unknown_gpu_is_refused_before_anything_is_written(here: Path, capsys: pytest.CaptureFixture) -> None:
    code, err = _init(["--model", "m", "--dataset", "d", "--gpu", "a1000"], capsys)
    assert code == 2 and err.startswith("dtype-doctor: error: --gpu must be one of") and list(here.iterdir()) == []
