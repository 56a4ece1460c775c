"""Bad usage and input that cannot be loaded: exit code 2, exactly one line on stderr that starts
with "dtype-doctor: error:", no traceback, nothing on stdout, and nothing in the user's
model / dataset / preprocess directories created, changed or deleted.

Most cases run in-process through `dtype_doctor.cli.main.run`; a few run as real processes to
see exactly what a user's terminal sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from dtype_doctor.cli.main import run

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"
BERT = FIX / "models" / "bert-tiny"
TEXT = FIX / "data" / "text-cls"
DEMO_MODEL = FIX / "demo" / "model"
DEMO_DATA = FIX / "demo" / "data"
PREFIX = "dtype-doctor: error: "


def tree_hash(*roots: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for root in roots:
        if not root.exists():
            continue
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for p in paths:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def user_dirs(argv: list[str], extra: Path) -> list[Path]:
    """Every existing path the command line names (model, dataset, the preprocess file's folder)."""
    dirs = [extra, BERT, TEXT]
    for a in argv:
        p = Path(a.split(".py:", 1)[0] + ".py" if ".py:" in a else a)
        if p.is_absolute() and p.exists():
            dirs.append(p.parent if p.is_file() else p)
    return dirs


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        run(argv)
    except SystemExit as exc:
        code = exc.code
    else:  # pragma: no cover
        raise AssertionError("run() returned without sys.exit")
    out, err = capsys.readouterr()
    return code, out, err  # type: ignore[return-value]


STAGE = re.compile(r"^dtype-doctor: \[\d+\.\d s\] ")  # a progress line on a pipe: `dtype-doctor: [3.2 s] tracing`


def assert_one_error_line(err: str, *needles: str) -> str:
    """One error line; before it, at most the stages the command reached (progress on a pipe).
    A mistake on the command line is refused before any stage: see test_early_errors."""
    lines = [line for line in err.splitlines() if not STAGE.match(line)]
    assert len(lines) == 1, err
    assert lines[0].startswith(PREFIX), err
    assert "Traceback" not in err and "internal error" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --------------------------------------------------------------------------- builders (in tmp_path)


def copy_bert(tmp: Path, name: str = "bert") -> Path:
    d = tmp / name
    shutil.copytree(BERT, d)
    return d


def edit_config(d: Path, fn: Callable[[dict], None]) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def not_a_model(tmp: Path) -> list[str]:
    d = tmp / "just-files"
    d.mkdir()
    (d / "notes.txt").write_text("hello")
    return ["scan", str(d), str(TEXT)]


def invalid_config(tmp: Path) -> list[str]:
    d = copy_bert(tmp)
    (d / "config.json").write_text("{not json")
    return ["scan", str(d), str(TEXT)]


def no_architectures(tmp: Path) -> list[str]:
    d = edit_config(copy_bert(tmp), lambda c: c.pop("architectures"))
    return ["scan", str(d), str(TEXT)]


def truncated_weights(tmp: Path) -> list[str]:
    d = copy_bert(tmp)
    f = d / "model.safetensors"
    with f.open("r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    return ["scan", str(d), str(TEXT)]


def config_does_not_match_weights(tmp: Path) -> list[str]:
    d = edit_config(copy_bert(tmp), lambda c: c.update(hidden_size=64, intermediate_size=128))
    return ["scan", str(d), str(TEXT)]


def no_weights_without_simulate(tmp: Path) -> list[str]:
    d = copy_bert(tmp)
    (d / "model.safetensors").unlink()
    return ["scan", str(d), str(TEXT)]


MODELING = """
import pathlib
pathlib.Path({marker!r}).write_text("the repository's code ran")
from transformers import PreTrainedModel, PretrainedConfig


class XConfig(PretrainedConfig):
    model_type = "x-custom-dd-cli"


class XModel(PreTrainedModel):
    config_class = XConfig
"""


def make_remote_code_model(tmp: Path, *, model_type: str = "x-custom-dd-cli", arch: str = "XModel") -> tuple[Path, Path]:
    d = copy_bert(tmp, "custom")
    marker = tmp / "MARKER"  # absolute: transformers would run a copy from its modules cache
    (d / "modeling_x.py").write_text(MODELING.format(marker=str(marker)))

    def patch(c: dict) -> None:
        c.update(model_type=model_type, architectures=[arch],
                 auto_map={"AutoConfig": "modeling_x.XConfig", "AutoModelForSequenceClassification": "modeling_x.XModel"})

    edit_config(d, patch)
    return d, marker


def remote_code(tmp: Path) -> list[str]:
    d, _ = make_remote_code_model(tmp)
    return ["scan", str(d), str(TEXT)]


def pickled_only(tmp: Path) -> list[str]:
    return ["scan", str(make_pickled(tmp)), str(TEXT)]


def make_pickled(tmp: Path) -> Path:
    import torch
    from safetensors.torch import load_file

    d = tmp / "pickled"
    d.mkdir()
    for f in BERT.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, d)
    torch.save(load_file(str(BERT / "model.safetensors")), d / "pytorch_model.bin")
    return d


def empty_saved_dataset(tmp: Path) -> list[str]:
    import datasets

    d = tmp / "empty-ds"
    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"text": [], "label": []}, features=feats).save_to_disk(str(d))
    return ["scan", str(BERT), str(d)]


def empty_csv(tmp: Path) -> list[str]:
    f = tmp / "empty.csv"
    f.write_text("text,label\n")
    return ["scan", str(BERT), str(f)]


def csv_bom_ragged(tmp: Path) -> list[str]:
    f = tmp / "rows.csv"
    f.write_bytes("\ufefftext,label\nhello,1\nworld,0,extra\nlast\n".encode("utf-8"))  # Excel's BOM, then ragged rows
    return ["scan", str(BERT), str(f)]


def unusable_columns(tmp: Path) -> list[str]:
    import datasets

    d = tmp / "foo-ds"
    datasets.Dataset.from_dict({"foo": [1, 2, 3, 4]}).save_to_disk(str(d))
    return ["scan", str(BERT), str(d)]


def prep_file(tmp: Path, body: str) -> Path:
    d = tmp / "user-code"
    d.mkdir(exist_ok=True)
    f = d / "prep.py"
    f.write_text(body)
    return f


def prep_missing_function(tmp: Path) -> list[str]:
    f = prep_file(tmp, "def preprocess(example):\n    return example\n")
    return ["scan", str(BERT), str(TEXT), "--preprocess", f"{f}:nope"]


def prep_raises(tmp: Path) -> list[str]:
    f = prep_file(tmp, "def boom(example):\n    raise ValueError('bad row\\nsecond line')\n")
    return ["scan", str(BERT), str(TEXT), "--preprocess", f"{f}:boom"]


def prep_import_fails(tmp: Path) -> list[str]:
    f = prep_file(tmp, "import no_such_module_dd\n\ndef preprocess(example):\n    return example\n")
    return ["scan", str(BERT), str(TEXT), "--preprocess", f"{f}:preprocess"]


def prep_syntax_error(tmp: Path) -> list[str]:
    f = prep_file(tmp, "def preprocess(example)\n    return example\n")
    return ["scan", str(BERT), str(TEXT), "--preprocess", f"{f}:preprocess"]


def output_unwritable(tmp: Path) -> list[str]:
    (tmp / "a-file").write_text("x")
    return ["scan", str(DEMO_MODEL), str(DEMO_DATA), "--output", str(tmp / "a-file" / "report.json")]


def fixed(*argv: str) -> Callable[[Path], list[str]]:
    return lambda tmp: list(argv)


S = ["scan", str(BERT), str(TEXT)]

CASES: dict[str, tuple[Callable[[Path], list[str]], tuple[str, ...]]] = {
    # model
    "missing-model": (fixed("scan", "/nonexistent/model-dir", str(TEXT)), ("/nonexistent/model-dir",)),
    "not-a-model": (not_a_model, ("no config.json",)),
    "invalid-config-json": (invalid_config, ("config.json", "not valid JSON")),
    "no-architectures": (no_architectures, ("architectures",)),
    "truncated-safetensors": (truncated_weights, ("model.safetensors", "truncated")),
    "config-vs-weights": (config_does_not_match_weights, ("do not match config.json", "[32]", "[64]")),
    "no-weights": (no_weights_without_simulate, ("--simulate",)),
    "remote-code": (remote_code, ("--trust-remote-code", "modeling_x.py")),
    "pickle-only": (pickled_only, ("pytorch_model.bin", "--allow-pickle")),
    # dataset
    "missing-dataset": (fixed("scan", str(BERT), "/nonexistent/data-dir"), ("/nonexistent/data-dir",)),
    "empty-save-to-disk": (empty_saved_dataset, ("no rows",)),
    "empty-csv": (empty_csv, ("no rows",)),
    "csv-bom-ragged": (csv_bom_ragged, ("rows.csv", "could not be read", "line 3")),
    "unknown-split": (fixed(*S, "--split", "validation"), ("'validation'", "train, test")),
    "unusable-columns": (unusable_columns, ("foo", "--preprocess")),
    # preprocess
    "prep-missing-file": (fixed(*S, "--preprocess", "/nonexistent/prep.py:preprocess"), ("/nonexistent/prep.py",)),
    "prep-missing-function": (prep_missing_function, ("'nope'", "preprocess")),
    "prep-raises": (prep_raises, (":boom", "ValueError", "bad row")),
    "prep-import-fails": (prep_import_fails, ("no_such_module_dd",)),
    "prep-syntax-error": (prep_syntax_error, ("prep.py",)),
    "prep-no-colon": (fixed(*S, "--preprocess", "prep.py"), ("FILE.py:FUNC",)),
    "prep-bad-mode": (fixed(*S, "--preprocess-mode", "eager"), ("--preprocess-mode",)),
    # options
    "batch-size-0": (fixed(*S, "--batch-size", "0"), ("--batch-size",)),
    "batch-size-not-int": (fixed(*S, "--batch-size", "two"), ("--batch-size",)),
    "unknown-format": (fixed(*S, "--format", "xml"), ("'xml'", "json")),
    "unknown-select": (fixed(*S, "--select", "DD999"), ("DD999",)),
    "unknown-ignore": (fixed(*S, "--ignore", "XX1"), ("XX1",)),
    "unknown-device": (fixed(*S, "--device", "tpu"), ("'tpu'", "cuda:N")),
    "unknown-dtype": (fixed(*S, "--dtype", "float64"), ("float64",)),
    "unknown-autocast": (fixed(*S, "--autocast", "yes"), ("--autocast",)),
    "unknown-fail-on": (fixed(*S, "--fail-on", "fatal"), ("--fail-on",)),
    "unknown-dataset-format": (fixed(*S, "--dataset-format", "pandas"), ("--dataset-format",)),
    "unknown-option": (fixed(*S, "--no-such-flag"), ("--no-such-flag",)),
    "missing-argument": (fixed("scan", str(BERT)), ("DATASET",)),
    "unknown-command": (fixed("diagnose"), ("diagnose",)),
    "output-unwritable": (output_unwritable, ("cannot write the report",)),
    # rules
    "unknown-rule": (fixed("rule", "DD999"), ("DD999", "DD101")),
    "unknown-rule-name": (fixed("rule", "no-such-rule"), ("no-such-rule",)),
    "rules-bad-format": (fixed("rules", "--format", "sarif"), ("sarif",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str) -> None:
    build, needles = CASES[case]
    argv = build(tmp_path)
    watched = user_dirs(argv, tmp_path)
    before = tree_hash(*watched)
    code, out, err = run_cli(capsys, argv)
    assert code == 2, (code, err)
    assert out == ""
    assert_one_error_line(err, *needles)
    assert tree_hash(*watched) == before  # nothing created, changed or deleted (no __pycache__ either)
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "auto-explicit"])
def test_cuda_without_a_gpu_suggests_simulate(capsys: pytest.CaptureFixture[str], device: str) -> None:
    if device == "auto-explicit":
        # auto falls back to cpu without a GPU: not an error
        code, out, _ = run_cli(capsys, ["scan", str(BERT), str(TEXT), "--device", "auto", "--format", "json"])
        assert code == 0 and json.loads(out)["target"]["device"] == "cpu"
        return
    code, out, err = run_cli(capsys, ["scan", str(BERT), str(TEXT), "--device", device])
    assert code == 2 and out == ""
    assert_one_error_line(err, "--simulate", device)


def test_remote_code_never_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a model type transformers does not know: refused (the case table checks the message)
    d, marker = make_remote_code_model(tmp_path / "a")
    code, _, err = run_cli(capsys, ["scan", str(d), str(TEXT), "--simulate"])
    assert code == 2 and not marker.exists()
    assert_one_error_line(err, "--trust-remote-code")
    # a known model type whose config also has an auto_map: transformers uses its own class
    # without --trust-remote-code, so the repository's module is never imported either
    (tmp_path / "b").mkdir()
    d2, marker2 = make_remote_code_model(tmp_path / "b", model_type="bert", arch="BertForSequenceClassification")
    before = tree_hash(d2)
    code, out, err = run_cli(capsys, ["scan", str(d2), str(TEXT), "--format", "json"])
    assert not marker2.exists()
    assert tree_hash(d2) == before
    if code == 2:
        assert_one_error_line(err, "--trust-remote-code")
    else:
        assert code == 0 and json.loads(out)["findings"] == []


def test_pickle_is_loaded_with_allow_pickle(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d = make_pickled(tmp_path)
    before = tree_hash(d)
    code, out, err = run_cli(capsys, ["scan", str(d), str(TEXT), "--allow-pickle", "--format", "json"])
    assert code == 0, err
    rep = json.loads(out)
    assert rep["findings"] == [] and rep["target"]["model_dtype"] == "float32"
    assert tree_hash(d) == before


def test_unknown_split_lists_the_available_ones(capsys: pytest.CaptureFixture[str]) -> None:
    _, _, err = run_cli(capsys, ["scan", str(BERT), str(TEXT), "--split", "nope"])
    line = assert_one_error_line(err)
    assert "available splits: train, test" in line


def test_debug_shows_the_traceback_and_keeps_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = truncated_weights(tmp_path) + ["--debug"]
    code, out, err = run_cli(capsys, argv)
    assert code == 2 and out == ""
    assert "Traceback (most recent call last)" in err
    assert "InputError" in err
    assert err.splitlines()[-1].startswith(PREFIX)  # the one line still comes last


# --------------------------------------------------------------------------- real processes


def _proc(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [sys.executable, "-m", "dtype_doctor", *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=300,
    )


def test_process_bad_model_one_line_no_traceback(tmp_path: Path) -> None:
    argv = truncated_weights(tmp_path)
    before = tree_hash(tmp_path)
    proc = _proc(*argv)
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_error_line(proc.stderr, "truncated")
    assert tree_hash(tmp_path) == before


def test_preprocess_import_leaves_no_pycache(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bytecode writing on, as in a user's shell: importing prep.py must not leave __pycache__ beside it
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    code, _, err = run_cli(capsys, prep_raises(tmp_path))
    assert code == 2 and "boom" in err
    assert sorted(p.name for p in (tmp_path / "user-code").iterdir()) == ["prep.py"]
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "prep.py").write_text((FIX / "demo" / "prep.py").read_text())
    code, _, _ = run_cli(capsys, ["scan", str(FIX / "models" / "resnet-tiny"), str(DEMO_DATA),
                                  "--preprocess", f"{ok / 'prep.py'}:preprocess"])
    assert code == 0
    assert sorted(p.name for p in ok.iterdir()) == ["prep.py"]


def test_process_usage_error_one_line() -> None:
    proc = _proc("scan", "--no-such-flag", str(BERT), str(TEXT))
    assert proc.returncode == 2 and proc.stdout == ""
    assert_one_error_line(proc.stderr, "--no-such-flag")
