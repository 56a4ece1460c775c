"""End-to-end tests of the real `dtype-doctor` CLI on the repository's fixtures.

Most cases call `dtype_doctor.cli.main.run(argv)` in-process (torch is imported once per
worker); a few run the console script / `python -m dtype_doctor` as a subprocess for what only a
real process shows: what reaches stderr and which modules a command imports.
Bad input (exit code 2) lives in tests/test_cli_bad_input.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dtype_doctor.cli.main import run

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "fixtures"
MODELS = FIX / "models"
DATA = FIX / "data"
DEMO_MODEL = FIX / "demo" / "model"
DEMO_DATA = FIX / "demo" / "data"
PREP = FIX / "demo" / "prep.py"
CONV = "resnet.embedder.embedder.convolution"


# --------------------------------------------------------------------------- helpers


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.out)


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> Result:
    """Run the CLI in-process as the console script would and return exit code, stdout, stderr."""
    capsys.readouterr()  # drop whatever fixtures printed
    try:
        run([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    else:  # pragma: no cover - run() always exits
        raise AssertionError("run() returned without sys.exit")
    out, err = capsys.readouterr()
    assert isinstance(code, int), code
    return Result(code, out, err)


STAGE = re.compile(r"^dtype-doctor: \[\d+\.\d s\] ")  # a progress line on a pipe


def progress_only(err: str) -> bool:
    """stderr holds the stages a piped command says and nothing else (no library's bars or logs)."""
    return all(STAGE.match(line) for line in err.splitlines())


def scan_json(capsys: pytest.CaptureFixture[str], model: Path, data: Path, *opts: object) -> tuple[int, dict[str, Any]]:
    r = cli(capsys, "scan", model, data, "--format", "json", *opts)
    assert progress_only(r.err), r.err  # nothing but the report on stdout, and the stages on stderr
    return r.code, r.json()


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


def lineage(report: dict[str, Any], name: str) -> list[tuple[str, str | None]]:
    return [(s["stage"], s["dtype"]) for s in report["lineage"][name]]


def tree_hash(*roots: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for p in paths:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def cast_line() -> int:
    """The line of prep.py that casts to float16."""
    lines = PREP.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if ".to(torch.float16)" in line)


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("FORCE_COLOR", None)
    return env


SPEC_TOP = {"schema_version", "tool", "target", "environment", "findings", "lineage", "summary"}
SPEC_TARGET = {"model", "dataset", "split", "device", "simulated", "model_dtype", "autocast", "train"}
SPEC_ENV = {"python", "torch", "transformers", "datasets", "cuda_available"}
SPEC_FINDING = {"code", "name", "severity", "message", "module", "module_type", "op", "stage", "tensors", "source", "fixes"}
SPEC_TENSOR = {"role", "name", "dtype", "device", "shape"}
SPEC_FIX = {"strategy", "applicability", "description"}
SPEC_SUMMARY = {"error", "warning", "info", "modules_traced", "ops_traced"}


# --------------------------------------------------------------------------- 1. the demo


def test_demo_rich_names_the_rule_module_and_stage(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA)
    assert r.code == 1
    assert progress_only(r.err) and r.err  # piped: one line per stage
    assert "DD101" in r.out
    assert CONV in r.out
    assert "stage processor" in r.out
    assert "1 error, 0 warnings, 0 info" in r.out
    assert "\x1b[" not in r.out  # not a terminal: no colour codes


def test_demo_json_has_every_spec_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA)
    assert code == 1
    assert SPEC_TOP <= set(rep)
    assert rep["schema_version"] == 1
    assert rep["tool"]["name"] == "dtype-doctor" and rep["tool"]["version"]
    t = rep["target"]
    assert SPEC_TARGET <= set(t)
    assert t["model"] == str(DEMO_MODEL) and t["dataset"] == str(DEMO_DATA) and t["split"] == "train"
    assert t["model_dtype"] == "float16" and t["device"] == "cpu"
    assert t["simulated"] is False and t["autocast"] is None and t["train"] is False
    env = rep["environment"]
    assert SPEC_ENV <= set(env)
    import torch

    assert env["torch"] == torch.__version__ and env["cuda_available"] is torch.cuda.is_available()

    assert codes(rep) == ["DD101"]
    f = rep["findings"][0]
    assert SPEC_FINDING <= set(f)
    assert f["name"] == "dtype-mismatch-in-op" and f["severity"] == "error"
    assert f["module"] == CONV and f["module_type"] == "Conv2d"
    assert f["op"] == "aten.convolution.default"
    assert f["stage"] == "processor"
    assert f["source"] is None  # the image processor is library code, not the user's
    assert "float32" in f["message"] and "float16" in f["message"]
    assert all(SPEC_TENSOR <= set(x) for x in f["tensors"])
    by_role = {x["role"]: x for x in f["tensors"]}
    assert by_role["input"]["name"] == "pixel_values" and by_role["input"]["dtype"] == "float32"
    assert by_role["input"]["shape"] == [2, 3, 32, 32] and by_role["input"]["device"] == "cpu"
    assert by_role["weight"]["name"] == f"{CONV}.weight" and by_role["weight"]["dtype"] == "float16"
    assert f["fixes"] and all(SPEC_FIX <= set(x) for x in f["fixes"])
    assert f["fixes"][0]["strategy"] == "cast-inputs" and f["fixes"][0]["applicability"] == "safe"

    assert {"pixel_values", "labels"} <= set(rep["lineage"])
    assert lineage(rep, "pixel_values")[:2] == [("dataset", "uint8"), ("processor", "float32")]
    assert lineage(rep, "pixel_values")[-1] == ("model-boundary", "float32")
    assert lineage(rep, "labels")[-1] == ("model-boundary", "int64")
    s = rep["summary"]
    assert SPEC_SUMMARY <= set(s)
    assert (s["error"], s["warning"], s["info"]) == (1, 0, 0)
    assert s["modules_traced"] > 0 and s["ops_traced"] > 0


def test_demo_output_file_and_empty_stdout(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "reports" / "dd.json"  # parent created
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA, "--format", "json", "--output", target)
    assert r.code == 1
    assert r.out == ""
    assert str(target) in r.err and len([x for x in r.err.splitlines() if not STAGE.match(x)]) == 1  # "report written to …"
    rep = json.loads(target.read_text())
    assert codes(rep) == ["DD101"]
    # rich to a file: plain text, no colour codes
    plain = tmp_path / "dd.txt"
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA, "-o", plain)
    assert r.code == 1 and r.out == ""
    text = plain.read_text()
    assert "DD101" in text and CONV in text and "\x1b[" not in text


@pytest.mark.parametrize(
    "opts,expected_codes",
    [
        (("--fail-on", "never"), ["DD101"]),
        (("--select", "DD2"), []),
        (("--select", "DD201"), []),
        (("--ignore", "DD101"), []),
        (("--ignore", "DD1"), []),
        (("--select", "DD1,DD201"), ["DD101"]),
    ],
    ids=["fail-on-never", "select-prefix", "select-code", "ignore-code", "ignore-prefix", "select-list"],
)
def test_demo_fail_on_select_ignore(capsys: pytest.CaptureFixture[str], opts: tuple[str, ...], expected_codes: list[str]) -> None:
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, *opts)
    assert codes(rep) == expected_codes
    assert code == (1 if expected_codes and "never" not in opts else 0)


def test_fail_on_levels(capsys: pytest.CaptureFixture[str]) -> None:
    # vit-tiny in float16 casts float32 pixel_values itself: one DD108 info
    model, data = MODELS / "vit-tiny", DATA / "images"
    for level, expected in (("error", 0), ("warning", 0), ("info", 1), ("never", 0)):
        code, rep = scan_json(capsys, model, data, "--dtype", "float16", "--fail-on", level)
        assert codes(rep) == ["DD108"]
        assert code == expected, level


def test_demo_sarif(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA, "--format", "sarif")
    assert r.code == 1
    sarif = json.loads(r.out)
    assert sarif["version"] == "2.1.0"
    (run_,) = sarif["runs"]
    assert run_["tool"]["driver"]["name"] == "dtype-doctor"
    assert [x["ruleId"] for x in run_["results"]] == ["DD101"]
    assert run_["results"][0]["level"] == "error"
    assert CONV in json.dumps(run_["results"][0])


def test_demo_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA, "--format", "markdown")
    assert r.code == 1
    assert r.out.startswith("## dtype-doctor")
    rows = [line for line in r.out.splitlines() if line.startswith("| DD101 |")]
    assert len(rows) == 1 and f"`{CONV}`" in rows[0] and "processor" in rows[0]


def test_demo_junit(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "scan", DEMO_MODEL, DEMO_DATA, "--format", "junit")
    assert r.code == 1
    root = ET.fromstring(r.out)
    cases = root.findall(".//testcase")
    assert len(cases) == 1 and cases[0].get("name") == CONV
    failure = cases[0].find("failure")
    assert failure is not None and "DD101" in (failure.get("type") or "")
    clean = cli(capsys, "scan", MODELS / "bert-tiny", DATA / "text-cls", "--format", "junit")
    assert clean.code == 0
    assert ET.fromstring(clean.out).findall(".//failure") == []


# --------------------------------------------------------------------------- 2. fixture pairs


@pytest.mark.parametrize("data", ["text-cls", "text-cls.csv", "text-cls.jsonl", "text-cls.parquet"])
def test_bert_text_cls_every_data_format_is_clean(capsys: pytest.CaptureFixture[str], data: str) -> None:
    code, rep = scan_json(capsys, MODELS / "bert-tiny", DATA / data)
    assert code == 0 and rep["findings"] == []
    assert rep["target"]["split"] == "train" and rep["target"]["model_dtype"] == "float32"
    assert {"input_ids", "attention_mask", "labels"} <= set(rep["lineage"])
    assert lineage(rep, "input_ids")[-1] == ("model-boundary", "int64")
    assert lineage(rep, "labels")[-1] == ("model-boundary", "int64")


def test_split_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, MODELS / "bert-tiny", DATA / "text-cls", "--split", "test", "--batch-size", "3")
    assert code == 0 and rep["target"]["split"] == "test"
    assert rep["lineage"]["labels"][-1]["shape"] == [3]


def test_bert_pretokenized_int32_is_made_int64_by_the_formatter(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, MODELS / "bert-tiny", DATA / "text-pretok")
    assert code == 0 and rep["findings"] == []
    for name in ("input_ids", "attention_mask", "labels"):
        steps = lineage(rep, name)
        assert steps[0] == ("dataset", "int32"), (name, steps)
        assert ("formatter", "int64") in steps, (name, steps)
        assert steps[-1] == ("model-boundary", "int64")


def test_bert_float16_with_int64_ids_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, MODELS / "bert-tiny", DATA / "text-cls", "--dtype", "float16")
    assert code == 0 and rep["findings"] == []
    assert rep["target"]["model_dtype"] == "float16"


def test_vit_float16_casts_pixel_values_itself_info_only(capsys: pytest.CaptureFixture[str]) -> None:
    for data in ("images", "images-ds"):
        code, rep = scan_json(capsys, MODELS / "vit-tiny", DATA / data, "--dtype", "float16")
        assert code == 0
        (f,) = rep["findings"]
        assert (f["code"], f["severity"]) == ("DD108", "info")
        assert "pixel_values" in f["message"] and "float32" in f["message"] and "float16" in f["message"]
        assert rep["summary"]["info"] == 1 and rep["summary"]["error"] == 0


def test_resnet_float16_with_float32_pixels_is_dd101(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, MODELS / "resnet-tiny", DATA / "images", "--dtype", "float16")
    assert code == 1
    assert codes(rep) == ["DD101"]
    assert rep["findings"][0]["module"] == CONV and rep["findings"][0]["stage"] == "processor"
    # the same model in float32 is clean
    code, rep = scan_json(capsys, MODELS / "resnet-tiny", DATA / "images")
    assert code == 0 and rep["findings"] == []


@pytest.mark.parametrize(
    "model,data,inputs",
    [
        ("wav2vec2-tiny", "audio", {"input_values", "labels"}),
        ("t5-tiny", "t5-pairs", {"input_ids", "attention_mask", "labels"}),
        ("llama-tiny", "lm-text", {"input_ids", "attention_mask", "labels"}),
    ],
)
def test_other_fixture_pairs_are_clean(capsys: pytest.CaptureFixture[str], model: str, data: str, inputs: set[str]) -> None:
    code, rep = scan_json(capsys, MODELS / model, DATA / data)
    assert code == 0 and rep["findings"] == []
    assert inputs <= set(rep["lineage"])
    assert rep["summary"]["ops_traced"] > 0


def test_audio_float64_is_made_float32_by_the_feature_extractor(capsys: pytest.CaptureFixture[str]) -> None:
    _, rep = scan_json(capsys, MODELS / "wav2vec2-tiny", DATA / "audio")
    steps = lineage(rep, "input_values")
    assert steps[0] == ("dataset", "float64") and ("processor", "float32") in steps


def test_int_labels_into_a_regression_head_warn(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, MODELS / "bert-tiny-regression", DATA / "text-regression-int")
    assert code == 0  # a warning does not fail the default --fail-on error
    (f,) = rep["findings"]
    assert (f["code"], f["severity"]) == ("DD104", "warning")
    code, _ = scan_json(capsys, MODELS / "bert-tiny-regression", DATA / "text-regression-int", "--fail-on", "warning")
    assert code == 1


def test_preprocess_transform_mode_points_at_the_cast(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(
        capsys, MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{PREP}:preprocess", "--preprocess-mode", "transform"
    )
    assert code == 1
    assert codes(rep) == ["DD101"]
    f = rep["findings"][0]
    assert f["module"] == CONV and f["stage"] == "preprocess"
    assert "float16" in f["message"] and "float32" in f["message"]
    assert f["source"] is not None
    assert Path(f["source"]["file"]).resolve() == PREP and f["source"]["line"] == cast_line()
    assert lineage(rep, "pixel_values")[0] == ("preprocess", "float16")
    assert lineage(rep, "pixel_values")[-1] == ("model-boundary", "float16")


def test_preprocess_relative_path_is_reported_as_given(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code, rep = scan_json(
        capsys, "fixtures/models/resnet-tiny", "fixtures/demo/data",
        "--preprocess", "fixtures/demo/prep.py:preprocess", "--preprocess-mode", "transform",
    )
    assert code == 1
    assert rep["findings"][0]["source"] == {"file": "fixtures/demo/prep.py", "line": cast_line()}


def test_preprocess_map_mode_the_formatter_undoes_the_cast(capsys: pytest.CaptureFixture[str]) -> None:
    # datasets.map stores the float16 tensor; the torch formatter gives float32 back
    code, rep = scan_json(capsys, MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{PREP}:preprocess")
    assert code == 0 and rep["findings"] == []
    steps = lineage(rep, "pixel_values")
    assert steps[0] == ("preprocess", "float16")
    assert ("formatter", "float32") in steps and steps[-1] == ("model-boundary", "float32")
    pre = rep["lineage"]["pixel_values"][0]
    assert pre["source"] is not None and Path(pre["source"]["file"]).resolve() == PREP
    # …so the half-precision demo model gets float32 from the formatter, not from the user's code
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--preprocess", f"{PREP}:preprocess")
    assert code == 1 and codes(rep) == ["DD101"]
    assert rep["findings"][0]["stage"] == "formatter"
    # and with_transform keeps float16: clean for the float16 model
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--preprocess", f"{PREP}:preprocess", "--preprocess-mode", "transform")
    assert code == 0 and rep["findings"] == []


def test_simulate_cuda_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--simulate", "--device", "cuda")
    assert code == 1
    assert rep["target"]["device"] == "cuda:0" and rep["target"]["simulated"] is True
    assert rep["target"]["model_dtype"] == "float16"
    assert rep["findings"][0]["code"] == "DD101" and rep["findings"][0]["module"] == CONV
    assert set(codes(rep)) == {"DD101"}
    # --device auto with --simulate targets CUDA too; cuda:N is kept
    _, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--simulate")
    assert rep["target"]["device"] == "cuda:0"
    _, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--simulate", "--device", "cuda:1")
    assert rep["target"]["device"] == "cuda:1"


def test_simulate_reports_what_the_real_run_reports(capsys: pytest.CaptureFixture[str]) -> None:
    _, real = scan_json(capsys, DEMO_MODEL, DEMO_DATA)
    _, sim = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--simulate", "--device", "cuda")
    assert [(f["code"], f["module"]) for f in sim["findings"]] == [(f["code"], f["module"]) for f in real["findings"]]


def test_simulate_needs_no_weights(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = tmp_path / "config-only"
    shutil.copytree(DEMO_MODEL, model, ignore=shutil.ignore_patterns("*.safetensors"))
    before = tree_hash(model)
    code, rep = scan_json(capsys, model, DEMO_DATA, "--simulate")
    assert code == 1 and rep["findings"][0]["module"] == CONV
    assert rep["target"]["simulated"] is True and rep["target"]["model_dtype"] == "float16"
    assert tree_hash(model) == before


def test_train_traces_the_backward_and_leaves_the_weights_alone(capsys: pytest.CaptureFixture[str]) -> None:
    model = MODELS / "bert-tiny"
    before = tree_hash(model)
    code, fwd = scan_json(capsys, model, DATA / "text-cls")
    code_t, trn = scan_json(capsys, model, DATA / "text-cls", "--train")
    assert code == code_t == 0
    assert trn["findings"] == []
    assert trn["target"]["train"] is True and fwd["target"]["train"] is False
    assert trn["summary"]["ops_traced"] > fwd["summary"]["ops_traced"]
    assert tree_hash(model) == before


@pytest.mark.parametrize("model,data", [("bert-tiny", "text-cls"), ("llama-tiny", "lm-text"), ("vit-tiny", "images")])
def test_float32_model_under_bfloat16_autocast_is_clean(capsys: pytest.CaptureFixture[str], model: str, data: str) -> None:
    code, rep = scan_json(capsys, MODELS / model, DATA / data, "--autocast", "bfloat16")
    assert code == 0 and rep["findings"] == []
    assert rep["target"]["autocast"] == "bfloat16" and rep["target"]["model_dtype"] == "float32"


def test_resnet_float32_under_bfloat16_autocast_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    # CPU autocast runs the convs in bf16 and BatchNorm takes bf16 input with fp32 params: it runs
    code, rep = scan_json(capsys, MODELS / "resnet-tiny", DEMO_DATA, "--autocast", "bfloat16")
    assert rep["findings"] == [] and code == 0


def test_demo_under_float16_autocast_is_clean(capsys: pytest.CaptureFixture[str]) -> None:
    # "a DD101 that autocast resolves is not reported at all": the fp16 demo runs under fp16 autocast
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--autocast", "float16")
    assert rep["findings"] == [] and code == 0


def test_demo_under_bfloat16_autocast_reports_the_half_batchnorm(capsys: pytest.CaptureFixture[str]) -> None:
    # bf16 conv output into float16 BatchNorm weights: a real failure
    # ("mixed dtype (CPU): expect parameter to have scalar type of Float")
    code, rep = scan_json(capsys, DEMO_MODEL, DEMO_DATA, "--autocast", "bfloat16")
    assert code == 1
    norms = [f for f in rep["findings"] if f["module_type"] == "BatchNorm2d"]
    assert norms and all(f["code"] == "DD101" for f in norms)
    assert "resnet.embedder.embedder.normalization" in {f["module"] for f in norms}


# --------------------------------------------------------------------------- 4. non-dtype failures


def test_shape_error_in_an_op_is_dd001_with_the_module(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prep = tmp_path / "prep_flat.py"
    prep.write_text(
        "import torch\n\n\ndef flat(example):\n"
        "    return {'pixel_values': torch.zeros(3, 32), 'label': example['label']}\n"
    )
    r = cli(capsys, "scan", MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{prep}:flat", "--format", "json")
    assert r.code == 1 and progress_only(r.err)
    rep = r.json()
    (f,) = rep["findings"]
    assert f["code"] == "DD001" and f["severity"] == "error"
    assert f["module"] == CONV and f["module_type"] == "Conv2d"
    assert "channels" in f["message"]
    assert not (tmp_path / "__pycache__").exists()
    # rich output: the finding, not a traceback
    r = cli(capsys, "scan", MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{prep}:flat")
    assert r.code == 1 and "DD001" in r.out and "Traceback" not in r.out + r.err


def test_python_error_inside_a_module_is_dd001(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # 5 channels: ResNetEmbeddings.forward raises a ValueError before any op runs
    prep = tmp_path / "prep_wrong.py"
    prep.write_text(
        "import torch\n\n\ndef wrong(example):\n"
        "    return {'pixel_values': torch.zeros(5, 32, 32), 'label': example['label']}\n"
    )
    for mode in ("map", "transform"):
        r = cli(capsys, "scan", MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{prep}:wrong",
                "--preprocess-mode", mode, "--format", "json")
        assert r.code == 1 and progress_only(r.err)
        (f,) = r.json()["findings"]
        assert f["code"] == "DD001" and "channel dimension" in f["message"]


def test_python_error_inside_a_module_names_the_module(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    prep = tmp_path / "prep_wrong.py"
    prep.write_text(
        "import torch\n\n\ndef wrong(example):\n"
        "    return {'pixel_values': torch.zeros(5, 32, 32), 'label': example['label']}\n"
    )
    r = cli(capsys, "scan", MODELS / "resnet-tiny", DEMO_DATA, "--preprocess", f"{prep}:wrong", "--format", "json")
    assert r.json()["findings"][0]["module"] == "resnet.embedder"


# --------------------------------------------------------------------------- 5. help and rules


def test_help_pages(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "--help")
    assert r.code == 0 and r.err == ""
    for cmd in ("scan", "rule", "rules"):
        assert cmd in r.out
    r = cli(capsys, "scan", "--help")
    assert r.code == 0 and r.err == ""
    for opt in ("--split", "--batch-size", "--preprocess", "--device", "--dtype", "--autocast", "--train",
                "--simulate", "--format", "--output", "--fail-on", "--select", "--ignore", "--trust-remote-code"):
        assert opt in r.out, opt
    assert "dtype-doctor scan fixtures/demo/model fixtures/demo/data" in r.out  # the examples epilog
    r = cli(capsys, "--version")
    assert r.code == 0 and r.out.strip() == f"dtype-doctor {__import__('dtype_doctor').__version__}"


def test_rules_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "rules")
    assert r.code == 0 and r.err == ""
    for code in ("DD101", "DD102", "DD103", "DD104", "DD201"):
        assert code in r.out
    assert "dtype-mismatch-in-op" in r.out
    r = cli(capsys, "rules", "--format", "json")
    assert r.code == 0
    rules = json.loads(r.out)
    by_code = {x["code"]: x for x in rules}
    assert {"DD101", "DD102", "DD103", "DD104", "DD105", "DD106", "DD108", "DD109", "DD201"} <= set(by_code)
    assert by_code["DD101"]["name"] == "dtype-mismatch-in-op" and by_code["DD101"]["severity"] == "error"
    assert by_code["DD108"]["severity"] == "info"
    assert all(x["summary"] and x["fix"] for x in rules)


@pytest.mark.parametrize("ref", ["DD101", "dd101", "dtype-mismatch-in-op"])
def test_rule_page(capsys: pytest.CaptureFixture[str], ref: str) -> None:
    r = cli(capsys, "rule", ref)
    assert r.code == 0 and r.err == ""
    assert "DD101" in r.out and "dtype-mismatch-in-op" in r.out
    assert "Fix" in r.out and "Example" in r.out


def test_rule_page_json(capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, "rule", "DD201", "--format", "json")
    assert r.code == 0
    doc = json.loads(r.out)
    assert doc["code"] == "DD201" and doc["name"] == "device-mismatch"


def _imported_heavy_modules(*argv: str) -> tuple[int, set[str], str]:
    """Run `python -X importtime -m dtype_doctor ARGV` and return the top-level packages imported."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dtype_doctor", *argv],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=120,
    )
    imported = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return proc.returncode, imported & {"torch", "transformers", "datasets", "numpy", "libcst", "PIL"}, proc.stdout


@pytest.mark.parametrize(
    "argv",
    [("--help",), ("scan", "--help"), ("--version",), ("rules",), ("rule", "DD101"), ("rules", "--format", "json")],
    ids=["help", "scan-help", "version", "rules", "rule", "rules-json"],
)
def test_help_and_rules_do_not_import_torch(argv: tuple[str, ...]) -> None:
    code, heavy, out = _imported_heavy_modules(*argv)
    assert code == 0 and out
    assert heavy == set(), f"{' '.join(argv)} imported {sorted(heavy)}"


# --------------------------------------------------------------------------- real processes


@pytest.mark.skipif(__import__("importlib").util.find_spec("torchao") is None, reason="torchao is not installed")
def test_torchao_is_imported_only_when_needed_and_its_import_lines_are_held_back(tmp_path: Path) -> None:
    # torchao's import-time log lines are held back by a filter on its logger, not by importing it up
    # front (1.0-2.5 s): a script that uses no quantized or transformers model never imports it, and
    # one that imports it leaves the doctor's stderr empty, whatever the plain import prints.
    exe = Path(sys.executable).with_name("dtype-doctor")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "dtype_doctor"]
    flag = tmp_path / "imported.txt"
    step = "import sys\nimport torch\n\nm = torch.nn.Linear(4, 4)\nm(torch.randn(2, 4))\n"
    for name, first, imported in (("plain.py", "", "False"), ("ao.py", "import torchao  # noqa: F401\n", "True")):
        script = tmp_path / name
        script.write_text(first + step + f"open({str(flag)!r}, 'w').write(str('torchao' in sys.modules))\n")
        proc = subprocess.run([*cmd, "run", "--", "python", str(script)], capture_output=True, text=True,
                              env=subprocess_env(), cwd=tmp_path, timeout=300)
        assert proc.returncode == 0 and progress_only(proc.stderr), proc.stderr
        assert flag.read_text() == imported


def test_console_script_demo_json() -> None:
    script = Path(sys.executable).with_name("dtype-doctor")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "dtype_doctor"]
    proc = subprocess.run(
        [*cmd, "scan", "fixtures/demo/model", "fixtures/demo/data", "--format", "json"],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert progress_only(proc.stderr)  # no progress bars, load reports or warnings from the libraries: our stages only
    rep = json.loads(proc.stdout)
    assert codes(rep) == ["DD101"] and rep["findings"][0]["module"] == CONV
    assert rep["target"]["model"] == "fixtures/demo/model"


def test_no_arguments_prints_the_help_and_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dtype_doctor"], capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Usage: dtype-doctor" in proc.stderr and "scan" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
