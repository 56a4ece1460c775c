"""Loading is honest: a checkpoint whose weights do not fit the architecture is never traced as a
random model in silence. transformers' own load report decides: weights missing or extra are a
warning on stderr and `target.loading` in the report; most weights missing is exit 2. Every load
error names the file at fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.test_cli_bad_input import TEXT, assert_one_error_line, run_cli, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
BERT = REPO / "fixtures" / "models" / "bert-tiny"
LLAMA = REPO / "fixtures" / "models" / "llama-tiny"


def bert_with(tmp: Path, weights: dict) -> Path:
    d = tmp / "bert"
    shutil.copytree(BERT, d)
    save_file(weights, str(d / "model.safetensors"))
    return d


def test_another_familys_weights_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = bert_with(tmp_path, load_file(str(LLAMA / "model.safetensors")))
    before = tree_hash(d)
    code, out, err = run_cli(capsys, ["scan", str(d), str(TEXT)])
    assert code == 2 and out == ""
    assert_one_error_line(err, str(d / "model.safetensors"), "holds 0 of the", "BertForSequenceClassification")
    assert tree_hash(d) == before


def test_a_checkpoint_with_none_of_the_models_tensors_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = load_file(str(BERT / "model.safetensors"))
    d = bert_with(tmp_path, {f"unrelated.{i}": v for i, v in enumerate(sd.values())})
    code, _, err = run_cli(capsys, ["scan", str(d), str(TEXT)])
    assert code == 2
    assert_one_error_line(err, "holds 0 of the")


def test_a_few_missing_weights_are_a_warning_and_in_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sd = load_file(str(BERT / "model.safetensors"))
    head = sorted(k for k in sd if k.startswith("classifier."))
    assert head  # the fixture has a classification head to leave out
    kept = {k: v for k, v in sd.items() if k not in head}
    kept["pooler.extra"] = next(iter(sd.values())).clone()
    d = bert_with(tmp_path, kept)
    code, out, err = run_cli(capsys, ["scan", str(d), str(TEXT), "--format", "json"])
    assert code == 0, err
    loading = json.loads(out)["target"]["loading"]
    assert loading["missing"] == head and loading["unexpected"] == ["pooler.extra"]
    assert loading["expected"] == len(sd)
    warnings = [ln for ln in err.splitlines() if ln.startswith("dtype-doctor: warning:")]
    assert len(warnings) == 1 and "initialised at random" in warnings[0] and head[0] in warnings[0], err


def test_a_complete_checkpoint_has_no_loading_block(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, ["scan", str(BERT), str(TEXT), "--format", "json"])
    assert code == 0, err
    assert "loading" not in json.loads(out)["target"] and "warning" not in err


def test_a_malformed_tokenizer_json_is_named_as_tokenizer_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "bert"
    shutil.copytree(BERT, d)
    assert (d / "tokenizer_config.json").is_file()  # the file transformers is pointed at
    (d / "tokenizer.json").write_text('{"version": ')
    code, _, err = run_cli(capsys, ["scan", str(d), str(TEXT)])
    assert code == 2
    line = assert_one_error_line(err, str(d / "tokenizer.json"))
    assert "tokenizer_config.json" not in line
