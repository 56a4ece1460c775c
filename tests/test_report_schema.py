"""The JSON report's published schema (dtype_doctor/data/report.schema.json) against real reports.

Each kind of report is made here by the CLI, in-process, as a user makes it (scan, fix with a
patch, a simulated scan, a simulated multi-GPU scan, compare, run, run --simulate) and validated
with jsonschema. Beyond these, conftest.py validates every JSON report the whole suite makes
(`Report.to_dict`, `Comparison.to_dict`, and report files written under pytest's temporary
directories); the last tests here show that net is live and that it bites.
"""

from __future__ import annotations

import copy
import json
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conftest import report_errors, validate_files, validate_report
from dtype_doctor.cli.main import run as cli

ROOT = Path(__file__).resolve().parents[1]
DEMO = [str(ROOT / "fixtures/demo/model"), str(ROOT / "fixtures/demo/data")]
BERT = [str(ROOT / "fixtures/models/bert-tiny"), str(ROOT / "fixtures/data/text-cls")]
LLAMA = [str(ROOT / "fixtures/models/llama-tiny"), str(ROOT / "fixtures/data/lm-text")]
AMP_LOOP = str(ROOT / "tests/scripts/seed_amp_loop.py")


def _schema() -> dict[str, Any]:
    return json.loads(files("dtype_doctor.data").joinpath("report.schema.json").read_text(encoding="utf-8"))


def _json_report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli([*argv])
    out, err = capsys.readouterr()
    assert done.value.code in (0, 1), err
    validate_report(out, " ".join(argv[:2]))  # the text as printed, besides the to_dict hook
    return json.loads(out)


def test_the_schema_is_a_valid_2020_12_schema_shipped_with_the_package() -> None:
    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"] == {"const": 1}


def test_the_schema_names_the_records_own_stages_severities_and_phases() -> None:
    """A stage, severity or phase added to the records must be added to the schema too."""
    from dtype_doctor.records import LINEAGE_STAGES, PHASES, SEVERITIES, STAGES

    defs = _schema()["$defs"]
    assert set(defs["stage"]["enum"]) == set(STAGES) | set(LINEAGE_STAGES)
    assert set(defs["severity"]["enum"]) == set(SEVERITIES)
    assert set(defs["coverage"]["properties"]["phases"]["propertyNames"]["enum"]) == set(PHASES)


# ------------------------------------------------------------------ each kind of report


def test_a_scan_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_report(capsys, "scan", *DEMO, "--format", "json")
    assert "DD101" in [f["code"] for f in report["findings"]] and report["coverage"]["complete"]


def test_a_fix_report_with_its_patch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = _json_report(capsys, "fix", *DEMO, "--format", "json", "--write-patch", str(tmp_path / "fix.patch"))
    fix = report["fix"]
    assert fix["verified"] and fix["patch"]["check"].startswith("dtype-doctor scan")
    assert fix["before"]["summary"] == report["summary"] and fix["tradeoff"]["half-model"]["weight_bytes"] > 0


def test_a_simulated_training_scan(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_report(capsys, "scan", *BERT, "--simulate", "--device", "cuda", "--dtype", "bfloat16", "--train",
                          "--format", "json")
    assert report["target"]["simulated"] and report["values"]["measured"] is False


def test_a_simulated_device_map(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("accelerate")
    report = _json_report(capsys, "scan", *LLAMA, "--simulate", "--gpus", "4",
                          "--max-memory", "0=300KiB,1=300KiB,2=300KiB,3=300KiB", "--format", "json")
    assert report["target"]["device_map"]["gpus"] == 4 and len(report["target"]["devices"]) >= 2


def test_a_compare_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_report(capsys, "compare", *BERT, "--variants", "fp32,half", "--repeat", "1", "--warmup", "0",
                          "--format", "json")
    assert "findings" not in report and [r["name"] for r in report["compare"]["rows"]] == ["fp32", "half"]


def test_a_run_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_report(capsys, "run", "--format", "json", "--", "python", AMP_LOOP, "1")
    assert [f["code"] for f in report["findings"]] == ["DD104"] and report["target"]["dataset"] is None


def test_a_simulated_run_report_with_its_stand_ins(capsys: pytest.CaptureFixture[str]) -> None:
    report = _json_report(capsys, "run", "--simulate", "--device", "cuda", "--gpu", "t4", "--format", "json",
                          "--", "python", AMP_LOOP, "1")
    assert report["stand_ins"] and report["coverage"]["phases"]["scaler"] is True


# ------------------------------------------------------------------ what the schema refuses


@pytest.fixture(scope="module")
def scanned() -> dict[str, Any]:
    """A real report, made through the API (its to_dict is the one the suite checks)."""
    import torch
    from transformers import AutoModelForImageClassification

    import dtype_doctor

    model = AutoModelForImageClassification.from_pretrained(DEMO[0])
    return json.loads(json.dumps(dtype_doctor.diagnose(model, {"pixel_values": torch.randn(2, 3, 32, 32)}).to_dict()))


def _broken(report: dict[str, Any], change: Any) -> list[str]:
    bad = copy.deepcopy(report)
    change(bad)
    return report_errors(bad)


def test_a_real_report_is_valid_and_its_optional_keys_are_described(scanned: dict[str, Any]) -> None:
    assert report_errors(scanned) == []
    grown = copy.deepcopy(scanned)
    grown["writes"] = [{"path": "model.pt", "bytes": 10, "source": {"file": "train.py", "line": 3}}]
    grown["suppressed"] = {"total": 1, "comment": 1, "baseline": 0, "findings": [
        {k: scanned["findings"][0][k] for k in ("code", "severity", "module", "message", "source", "fingerprint")} | {"by": "comment"}]}
    grown["target"]["attention"] = {"implementation": "sdpa", "origin": "default", "traced_as": None}
    assert report_errors(grown) == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda r: r.update(new_block={}), "(top)"),
        (lambda r: r["target"].update(precision="bf16"), "target"),
        (lambda r: r["findings"][0].update(hint="x"), "findings/0"),
        (lambda r: r["findings"][0]["tensors"][0].update(stride=[1]), "findings/0/tensors/0"),
        (lambda r: r["coverage"].update(extra=1), "coverage"),
        (lambda r: r["environment"].update(cuda="12.4"), "environment"),
    ],
    ids=["top", "target", "finding", "tensor", "coverage", "environment"],
)
def test_a_key_the_schema_does_not_describe_fails(scanned: dict[str, Any], change: Any, where: str) -> None:
    """The schema is the report's contract: a key added to a report without its description here fails
    (conftest validates every report the suite makes, so the change that adds the key must add it here)."""
    errors = _broken(scanned, change)
    assert errors and all(e.startswith(where) and "Additional properties" in e for e in errors), errors


def test_every_object_the_schema_describes_is_closed() -> None:
    """Each object with listed properties allows no others; the maps (lineage by input, a device map,
    the launch configuration as read) name what their values are instead."""
    open_places = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node and node.get("additionalProperties") is not False:
                open_places.append(path)
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(_schema(), "")
    assert open_places == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda r: r["target"].update(simulated="no"), "target/simulated"),
        (lambda r: r["findings"][0].update(severity="fatal"), "findings/0/severity"),
        (lambda r: r["findings"][0].pop("stage"), "findings/0"),
        (lambda r: r["findings"][0]["tensors"][0].update(shape=["2"]), "findings/0/tensors/0/shape/0"),
        (lambda r: r["summary"].update(error=-1), "summary/error"),
        (lambda r: r.update(schema_version=2), "schema_version"),
        (lambda r: r.pop("findings"), "(top)"),
        (lambda r: r["coverage"].update(stopped=3), "coverage/stopped"),
    ],
    ids=["bool-as-string", "unknown-severity", "missing-key", "shape-of-strings", "negative-count", "version",
         "no-findings", "stopped-as-int"],
)
def test_a_report_with_a_wrong_type_or_a_missing_key_fails(scanned: dict[str, Any], change: Any, where: str) -> None:
    errors = _broken(scanned, change)
    assert errors and all(e.startswith(where) for e in errors), errors


def test_the_suites_to_dict_hook_validates_every_report_made(scanned: dict[str, Any]) -> None:
    """conftest wraps Report.to_dict: a report the records cannot describe fails where it is made."""
    from dtype_doctor.records import Report, Target

    bad = Report((), Target("m", "d", "train", "cpu", "no", "float32", None, False), dict(scanned["environment"]))
    with pytest.raises(AssertionError, match="report.schema.json"):
        bad.to_dict()


def test_the_suites_file_check_validates_a_report_a_subprocess_wrote(scanned: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # not under pytest's temporary directories, which the session checks
        (Path(tmp) / "report.json").write_text(json.dumps(scanned), encoding="utf-8")
        validate_files(Path(tmp))  # a real report passes
        (Path(tmp) / "report.json").write_text(json.dumps({**scanned, "summary": {}}), encoding="utf-8")
        with pytest.raises(AssertionError, match="report.json does not match"):
            validate_files(Path(tmp))
