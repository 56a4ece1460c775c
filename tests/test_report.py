"""The report stage on hand-built Reports: every format checked for what a reader or a CI
system relies on, and the rich / markdown output against snapshots at a fixed width.

Update snapshots with: DTYPE_DOCTOR_UPDATE_SNAPSHOTS=1 pytest tests/test_report.py
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from rich.cells import cell_len
from hypothesis import strategies as st

from dtype_doctor import __version__
from dtype_doctor.fix.outcome import FixOutcome, Parity, PatchOutcome, Step
from dtype_doctor.records.errors import UsageError
from dtype_doctor.records import (
    FixSuggestion,
    Finding,
    LineageStep,
    ModelInfo,
    ModuleCall,
    OpCall,
    Report,
    SourceLoc,
    StateTensor,
    Target,
    TensorMeta,
    Trace,
    TraceFailure,
)
from dtype_doctor.report import FORMATS, print_report, render, render_renderable, rule_doc, rules_table
from dtype_doctor.report.common import is_failing, lineage_rows, summary_line, tensor_label
from dtype_doctor.report.dtype_tree import dtype_tree
from conftest import github_sarif_errors

SNAPSHOTS = Path(__file__).parent / "snapshots" / "report"
CONV = "resnet.embedder.embedder.convolution"


# ----------------------------------------------------------------------------- fixtures


def _model(extra_state: tuple[StateTensor, ...] = (), extra_types: tuple[tuple[str, str], ...] = ()) -> ModelInfo:
    state = (
        StateTensor(f"{CONV}.weight", "parameter", "float16", "cpu", (8, 3, 7, 7), True),
        StateTensor("resnet.embedder.embedder.normalization.weight", "parameter", "float16", "cpu", (8,), True),
        StateTensor("resnet.embedder.embedder.normalization.bias", "parameter", "float16", "cpu", (8,), True),
        StateTensor("resnet.encoder.stages.0.layers.0.conv.weight", "parameter", "float16", "cpu", (8, 8, 3, 3), True),
        StateTensor("classifier.1.weight", "parameter", "float32", "cpu", (3, 8), True),
        StateTensor("classifier.1.bias", "parameter", "float32", "cpu", (3,), True),
        StateTensor("resnet.embedder.embedder.normalization.running_mean", "buffer", "float32", "cpu", (8,)),
    ) + extra_state
    types = (
        ("", "ResNetForImageClassification"),
        ("resnet", "ResNetModel"),
        ("resnet.embedder", "ResNetEmbeddings"),
        ("resnet.embedder.embedder", "ResNetConvLayer"),
        (CONV, "Conv2d"),
        ("resnet.embedder.embedder.normalization", "BatchNorm2d"),
        ("resnet.encoder", "ResNetEncoder"),
        ("resnet.encoder.stages", "ModuleList"),
        ("resnet.encoder.stages.0", "ResNetStage"),
        ("resnet.encoder.stages.0.layers", "Sequential"),
        ("resnet.encoder.stages.0.layers.0", "ResNetBasicLayer"),
        ("resnet.encoder.stages.0.layers.0.conv", "Conv2d"),
        ("classifier", "Sequential"),
        ("classifier.0", "Flatten"),
        ("classifier.1", "Linear"),
    ) + extra_types
    return ModelInfo("ResNetForImageClassification", state, module_types=types)


PIXELS_IN = TensorMeta("float32", "cpu", (2, 3, 32, 32), "input", "pixel_values", "input:pixel_values")
CONV_WEIGHT = TensorMeta("float16", "cpu", (8, 3, 7, 7), "weight", f"{CONV}.weight", f"param:{CONV}.weight")
LABELS = TensorMeta("int32", "cpu", (2,), "target", "labels", "input:labels")

DD101 = Finding(
    code="DD101",
    name="dtype-mismatch-in-op",
    severity="error",
    message="Conv2d received float32 input but its weight is float16",
    module=CONV,
    module_type="Conv2d",
    op="aten.convolution.default",
    stage="formatter",
    tensors=(PIXELS_IN, CONV_WEIGHT),
    source=SourceLoc("prep.py", 12),
    fixes=(
        FixSuggestion("cast-inputs", "safe", "cast pixel_values to float16 before the forward"),
        FixSuggestion("autocast", "safe", "run the forward under torch.autocast('cuda', float16)"),
    ),
    pytorch_error="Input type (float) and bias type (c10::Half) should be the same",
)
DD104 = Finding(
    code="DD104",
    name="loss-target-dtype",
    severity="warning",
    message="cross_entropy target is int32; torch accepts it on this device but not on CUDA",
    module="",
    module_type="ResNetForImageClassification",
    op="aten.nll_loss_forward.default",
    stage="dataset",
    tensors=(LABELS,),
    fixes=(FixSuggestion("cast-inputs", "safe", "cast labels to int64"),),
)
DD108 = Finding(
    code="DD108",
    name="implicit-cast",
    severity="info",
    message="the model casts pixel_values from float32 to float16 itself (costs a copy) | see <docs>",
    module="resnet.embedder",
    module_type="ResNetEmbeddings",
    op=None,
    stage="processor",
    tensors=(PIXELS_IN,),
)

LINEAGE = {
    "pixel_values": (
        LineageStep("dataset", "uint8", "cpu", (2, 32, 32, 3), "PIL images"),
        LineageStep("processor", "uint8", "cpu", (2, 3, 32, 32), "ConvNextImageProcessor(do_rescale=False)"),
        LineageStep(
            "formatter",
            "float32",
            "cpu",
            (2, 3, 32, 32),
            "datasets TorchFormatter casts floating columns to float32",
            SourceLoc("prep.py", 12),
        ),
        LineageStep("transfer", "float32", "cuda:0", (2, 3, 32, 32), "batch.to('cuda:0')"),
        LineageStep("model-boundary", "float32", "cuda:0", (2, 3, 32, 32)),
    ),
    "labels": (
        LineageStep("dataset", "int32", "cpu", (2,), "ClassLabel stored as int32"),
        LineageStep("model-boundary", "int32", "cpu", (2,)),
    ),
}

TARGET = Target(
    model="./models/tiny-resnet",
    dataset="./data/beans",
    split="train",
    device="cuda:0",
    simulated=True,
    model_dtype="float16",
    autocast=None,
    train=False,
)
ENVIRONMENT = {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.0.0", "datasets": "3.2.0", "cuda_available": False}

FAILURE = TraceFailure(
    kind="dtype",
    message="Input type (float) and bias type (c10::Half) should be the same",
    module=CONV,
    module_type="Conv2d",
    op="aten.convolution.default",
)

FIX_BLOCK = FixOutcome(
    strategy="cast-inputs",
    steps=(
        Step("cast-inputs", "applied", "pixel_values → float16 after the formatter"),
        Step("cast-inputs", "applied", "labels → int64"),
        Step("to-device", "skipped", "inputs already on cuda:0"),
    ),
    verified=True,
    after_findings=(DD108,),
    after_summary={"error": 0, "warning": 0, "info": 1, "modules_traced": 15, "ops_traced": 40},
    converged=True,
    rounds=1,
    detail="verified: the re-run trace has no finding at or above error",
    parity=Parity(reference="float32", max_abs_diff=0.00048828125, cosine=0.99999994),
    patch=PatchOutcome("fix.patch", ("prep.py",)),
)


def _trace(failure: TraceFailure | None = None, model: ModelInfo | None = None) -> Trace:
    modules = tuple(ModuleCall(n, t, (), ()) for n, t in (model or _model()).module_types)
    ops = tuple(OpCall(i, "aten.add.Tensor", CONV, "Conv2d", ()) for i in range(42))
    return Trace(
        ops=ops,
        modules=modules,
        model=model or _model(),
        inputs=(PIXELS_IN, LABELS),
        lineage=LINEAGE,
        device="cuda:0",
        simulated=True,
        failure=failure,
    )


def full_report(**kw) -> Report:
    base = dict(
        findings=(DD101, DD104, DD108),
        target=TARGET,
        environment=ENVIRONMENT,
        trace=_trace(FAILURE),
        fix=None,
    )
    base.update(kw)
    return Report(**base)


def clean_report() -> Report:
    return Report(findings=(), target=TARGET, environment=ENVIRONMENT, trace=_trace())


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("DTYPE_DOCTOR_UPDATE_SNAPSHOTS") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not os.environ.get("DTYPE_DOCTOR_UPDATE_SNAPSHOTS"):
            pytest.fail(f"snapshot {name} was missing and has been written; re-run")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs; see the diff above or update the snapshot"


# ----------------------------------------------------------------------------- interface


def test_formats_are_the_spec_list():
    assert FORMATS == ("rich", "github", "json", "junit", "markdown", "sarif")  # discovered; rich (the default) first


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_every_report(fmt):
    for report in (full_report(), full_report(fix=FIX_BLOCK), clean_report(), full_report(trace=None)):
        text = render(report, fmt, width=80)
        assert text.endswith("\n") and text.strip()


def test_unknown_format_is_a_usage_error_listing_the_formats():
    with pytest.raises(UsageError) as e:
        render(full_report(), "yaml")
    msg = str(e.value)
    assert "\n" not in msg and "yaml" in msg
    assert all(f in msg for f in FORMATS)
    with pytest.raises(UsageError):
        print_report(full_report(), "xml", _console())


def test_unknown_fail_on_is_a_usage_error():
    with pytest.raises(UsageError, match="fail-on"):
        render(full_report(), "junit", fail_on="critical")


def test_importing_the_report_stage_and_rendering_does_not_import_torch():
    code = (
        "import sys, dtype_doctor.report as r, dtype_doctor.report.console, dtype_doctor.report.sarif, "
        "dtype_doctor.report.junit, dtype_doctor.report.markdown, dtype_doctor.report.json, "
        "dtype_doctor.report.rule_docs, dtype_doctor.report.dtype_tree\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_json_format_does_not_need_rich():
    code = (
        "import sys\nfrom dtype_doctor.records import Report, Target\nfrom dtype_doctor.report import render\n"
        "t = Target('m', None, None, 'cpu', False, None, None, False)\n"
        "render(Report((), t, {}), 'json'); render(Report((), t, {}), 'sarif'); render(Report((), t, {}), 'junit')\n"
        "assert not any(m == 'rich' or m.startswith('rich.') for m in sys.modules), 'rich imported'\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------------- shared helpers


def test_tensor_label_is_name_dtype_at_device_shape():
    assert tensor_label(PIXELS_IN) == "pixel_values float32@cpu[2,3,32,32]"
    assert tensor_label(CONV_WEIGHT, relative_to=CONV) == "weight float16@cpu[8,3,7,7]"
    assert tensor_label(TensorMeta("float32", "cpu", (), "other")) == "other float32@cpu[]"


def test_summary_line_counts_and_pluralises():
    assert summary_line({"error": 2, "warning": 1, "info": 0, "modules_traced": 57, "ops_traced": 812}) == (
        "2 errors, 1 warning, 0 info · 57 modules, 812 ops traced"
    )
    assert summary_line({"error": 1, "warning": 0, "info": 3, "modules_traced": 1, "ops_traced": 1}) == (
        "1 error, 0 warnings, 3 info · 1 module, 1 op traced"
    )


def test_lineage_rows_mark_the_stage_that_changed_dtype_and_device():
    rows = lineage_rows(LINEAGE["pixel_values"])
    assert [r.step.stage for r in rows if r.dtype_changed] == ["formatter"]
    assert rows[2].dtype_text() == "uint8 → float32"
    assert [r.step.stage for r in rows if r.device_changed] == ["transfer"]
    assert rows[2].detail_text().endswith("(prep.py:12)")
    # An unknown dtype in between is not a change, nor is it the new reference.
    steps = (LineageStep("dataset", "int64"), LineageStep("preprocess", None), LineageStep("collator", "int64"))
    assert not any(r.dtype_changed for r in lineage_rows(steps))


# ----------------------------------------------------------------------------- json


def test_json_round_trips_and_has_every_spec_key():
    report = full_report(fix=FIX_BLOCK)
    d = json.loads(render(report, "json"))
    assert d == json.loads(json.dumps(report.to_dict()))
    assert d["schema_version"] == 1
    assert d["tool"] == {"name": "dtype-doctor", "version": __version__}
    assert set(d["target"]) == {"model", "dataset", "split", "device", "simulated", "model_dtype", "autocast", "train", "gpu"}
    assert isinstance(d["target"]["simulated"], bool) and isinstance(d["target"]["train"], bool)
    assert set(d["environment"]) >= {"python", "torch", "transformers", "datasets", "cuda_available"}
    finding_keys = {"code", "name", "severity", "message", "module", "module_type", "op", "stage", "tensors", "source", "fixes"}
    for f in d["findings"]:
        assert set(f) >= finding_keys
        assert f["severity"] in ("error", "warning", "info")
        assert f["op"] is None or isinstance(f["op"], str)
        assert f["source"] is None or (isinstance(f["source"]["file"], str) and isinstance(f["source"]["line"], int))
        for t in f["tensors"]:
            assert set(t) == {"role", "name", "dtype", "device", "shape"}
            assert isinstance(t["shape"], list) and all(isinstance(n, int) for n in t["shape"])
        for x in f["fixes"]:
            assert set(x) == {"strategy", "applicability", "description"}
    first = d["findings"][0]
    assert first["code"] == "DD101" and first["module"] == CONV and first["source"] == {"file": "prep.py", "line": 12}
    assert first["tensors"][0] == {"role": "input", "name": "pixel_values", "dtype": "float32", "device": "cpu", "shape": [2, 3, 32, 32]}
    assert d["findings"][1]["module"] == ""  # model boundary stays "" in JSON
    assert [s["stage"] for s in d["lineage"]["pixel_values"]][2] == "formatter"
    assert d["lineage"]["pixel_values"][2]["dtype"] == "float32"
    assert d["summary"] == {"error": 1, "warning": 1, "info": 1, "modules_traced": 15, "ops_traced": 42}
    assert all(isinstance(v, int) for v in d["summary"].values())
    assert d["trace_failure"]["module"] == CONV
    fix = d["fix"]
    assert set(fix) >= {"strategy", "applied", "verified", "after", "parity", "patch"}
    assert all(a["status"] in ("applied", "skipped", "failed") for a in fix["applied"])
    assert isinstance(fix["verified"], bool)
    assert set(fix["after"]) == {"findings", "summary"}


def test_json_without_fix_or_failure_has_no_such_keys():
    d = json.loads(render(clean_report(), "json"))
    assert "fix" not in d and "trace_failure" not in d
    assert d["findings"] == []


def test_json_serialises_records_inside_a_fix_block():
    d = json.loads(render(full_report(fix=FIX_BLOCK), "json"))
    assert d["fix"]["after"]["findings"][0]["code"] == "DD108"


# ----------------------------------------------------------------------------- sarif


def _sarif(report: Report, **kw) -> dict:
    return json.loads(render(report, "sarif", **kw))


def test_sarif_is_structurally_valid_2_1_0():
    log = _sarif(full_report(fix=FIX_BLOCK))
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    assert len(log["runs"]) == 1
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "dtype-doctor" and driver["version"] == __version__
    rule_ids = [r["id"] for r in driver["rules"]]
    assert rule_ids == ["DD101", "DD104", "DD108"]  # without the catalogue: one per code that appears, in order
    for r in driver["rules"]:
        assert isinstance(r["name"], str) and r["shortDescription"]["text"] and r["help"]["text"]
        assert r["helpUri"] == f"docs/rules.md#{r['id'].lower()}"
    assert len(run["results"]) == 3
    for res in run["results"]:
        assert res["ruleId"] == rule_ids[res["ruleIndex"]]
        assert res["level"] in ("error", "warning", "note")
        assert res["message"]["text"]
        (loc,) = res["locations"]
        phys = loc["physicalLocation"]
        assert phys["artifactLocation"]["uri"] and phys["region"]["startLine"] >= 1
        assert set(phys["region"]) == {"startLine", "startColumn", "endLine", "endColumn"}
        for ll in loc["logicalLocations"]:
            assert ll["kind"] == "module" and ll["fullyQualifiedName"]
        assert set(res["properties"]) >= {"stage", "op", "tensors"}
    assert run["invocations"][0]["executionSuccessful"] is True
    assert github_sarif_errors(log) == []


def test_sarif_levels_and_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # The user's line, as the lineage found it; its region the whole line.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prep.py").write_text("\n" * 11 + "    x = x.half()\n")
    results = _sarif(full_report())["runs"][0]["results"]
    assert [r["level"] for r in results] == ["error", "warning", "note"]
    conv = results[0]["locations"][0]
    assert conv["physicalLocation"] == {"artifactLocation": {"uri": "prep.py"},
                                        "region": {"startLine": 12, "startColumn": 1, "endLine": 12, "endColumn": 17}}
    assert conv["logicalLocations"][0] == {"name": "convolution", "fullyQualifiedName": CONV, "kind": "module"}
    # No source and no local model or dataset: the config file of the check, its first line.
    (tmp_path / "pyproject.toml").write_text("[tool.dtype-doctor]\n")
    results = _sarif(full_report())["runs"][0]["results"]
    boundary = results[1]["locations"][0]
    assert boundary["physicalLocation"]["artifactLocation"]["uri"] == "pyproject.toml"
    assert boundary["logicalLocations"][0]["fullyQualifiedName"] == "ResNetForImageClassification"
    assert results[0]["properties"]["stage"] == "formatter"
    assert results[0]["properties"]["tensors"][1]["dtype"] == "float16"
    assert results[0]["partialFingerprints"]["dtypeDoctor/v1"] != results[1]["partialFingerprints"]["dtypeDoctor/v1"]


def test_sarif_locates_model_level_findings_in_the_model_config_then_the_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{\n  "architectures": ["X"],\n  "torch_dtype": "float16"\n}\n')
    (tmp_path / "train.csv").write_text("text,label\na,1\n")
    no_source = replace(DD104, source=None)
    target = replace(TARGET, model=str(tmp_path / "model"), dataset="train.csv")
    (res,) = _sarif(full_report(findings=(no_source,), target=target))["runs"][0]["results"]
    phys = res["locations"][0]["physicalLocation"]
    assert phys["artifactLocation"]["uri"] == "model/config.json"  # relative to the repository root
    assert phys["region"]["startLine"] == 3  # the checkpoint's dtype line
    target = replace(TARGET, model="org/hub-model", dataset="train.csv")
    (res,) = _sarif(full_report(findings=(no_source,), target=target))["runs"][0]["results"]
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.csv"


def test_sarif_fingerprints_are_stable_across_runs_lines_and_values():
    moved = replace(DD101, source=SourceLoc("prep.py", 40), message=DD101.message.replace("float32", "float32 (again)"),
                    tensors=tuple(replace(t, shape=(8, *t.shape[1:])) for t in DD101.tensors))
    first = _sarif(full_report(findings=(DD101,)))["runs"][0]["results"][0]["partialFingerprints"]
    again = _sarif(full_report(findings=(moved,)))["runs"][0]["results"][0]["partialFingerprints"]
    assert first == again and first["primaryLocationLineHash"].endswith(":1")
    other = replace(DD101, module="classifier.1")
    assert _sarif(full_report(findings=(other,)))["runs"][0]["results"][0]["partialFingerprints"] != first
    # Two results with one fingerprint in one file: GitHub's occurrence counter tells them apart.
    twice = _sarif(full_report(findings=(DD101, DD101)))["runs"][0]["results"]
    assert [r["partialFingerprints"]["primaryLocationLineHash"][-2:] for r in twice] == [":1", ":2"]


def test_sarif_absolute_source_becomes_a_file_uri():
    f = replace(DD101, source=SourceLoc("/home/me/my proj/prep.py", 3))
    loc = _sarif(full_report(findings=(f,)))["runs"][0]["results"][0]["locations"][0]
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == "file:///home/me/my%20proj/prep.py"


def test_sarif_absolute_source_inside_the_repository_is_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    f = replace(DD101, source=SourceLoc(str(tmp_path / "src" / "prep.py"), 3))
    loc = _sarif(full_report(findings=(f,)))["runs"][0]["results"][0]["locations"][0]
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == "src/prep.py"


def test_sarif_trace_failure_is_a_tool_notification():
    inv = _sarif(full_report())["runs"][0]["invocations"][0]
    assert inv["toolExecutionNotifications"][0]["level"] == "error"
    assert CONV in inv["toolExecutionNotifications"][0]["message"]["text"]


def test_sarif_describes_rules_from_the_catalogue_when_given(monkeypatch: pytest.MonkeyPatch):
    driver = _sarif(full_report(), rules=CATALOGUE)["runs"][0]["tool"]["driver"]
    assert [r["id"] for r in driver["rules"]][:2] == ["DD101", "DD201"]  # the whole catalogue, then codes it lacks
    assert {r["id"] for r in driver["rules"]} >= {"DD104", "DD108"}
    dd101 = driver["rules"][0]
    assert dd101["shortDescription"]["text"] == CATALOGUE[0].summary
    assert dd101["fullDescription"]["text"] == CATALOGUE[0].why
    assert dd101["help"]["text"] == CATALOGUE[0].fix and CATALOGUE[0].why in dd101["help"]["markdown"]
    assert dd101["defaultConfiguration"] == {"level": "error"}
    assert dd101["helpUri"] == "docs/rules.md#dd101"
    monkeypatch.setenv("DTYPE_DOCTOR_DOCS_URL", "https://example.org/dtype-doctor/rules/")
    driver = _sarif(full_report(), rules=CATALOGUE)["runs"][0]["tool"]["driver"]
    assert driver["rules"][0]["helpUri"] == "https://example.org/dtype-doctor/rules/#dd101"
    # Without the catalogue, the rule's name in words.
    assert _sarif(full_report())["runs"][0]["tool"]["driver"]["rules"][0]["shortDescription"]["text"] == "dtype mismatch in op"


def test_sarif_with_no_findings_has_no_results_and_describes_the_catalogue():
    run = _sarif(clean_report())["runs"][0]
    assert run["results"] == [] and run["tool"]["driver"]["rules"] == []
    run = _sarif(clean_report(), rules=CATALOGUE)["runs"][0]
    assert run["results"] == [] and [r["id"] for r in run["tool"]["driver"]["rules"]] == [r.code for r in CATALOGUE]


def test_sarif_stays_within_githubs_result_limit(monkeypatch: pytest.MonkeyPatch):
    from dtype_doctor.report import sarif

    monkeypatch.setattr(sarif, "MAX_RESULTS", 5)  # 25,000 in production: the same code path, faster
    many = tuple(replace(DD108, module=f"m{i}") for i in range(12)) + (DD101,)
    log = _sarif(full_report(findings=many))
    run = log["runs"][0]
    assert len(run["results"]) == 5
    assert run["results"][-1]["ruleId"] == "DD101"  # the most severe kept
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert any("8 less severe result(s) left out" in n["message"]["text"] for n in notes)


def test_sarif_stays_within_githubs_size_limit(monkeypatch: pytest.MonkeyPatch):
    import gzip

    from dtype_doctor.report import sarif

    monkeypatch.setattr(sarif, "MAX_GZIP_BYTES", 6_000)  # 10 MB in production
    many = tuple(replace(DD108, module=f"m{i}", message=f"{i} " + "x" * 50) for i in range(200))
    text = render(full_report(findings=many), "sarif")
    assert len(gzip.compress(json.dumps(json.loads(text)).encode())) <= 6_000
    run = json.loads(text)["runs"][0]
    assert 0 < len(run["results"]) < 200 and "properties" not in run["results"][0]
    assert "left out" in run["invocations"][0]["toolExecutionNotifications"][-1]["message"]["text"]


# ----------------------------------------------------------------------------- junit


def _junit(report: Report, **kw) -> ET.Element:
    text = render(report, "junit", **kw)
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    root = ET.fromstring(text)
    assert root.tag == "testsuites"
    return root


def _suite(root: ET.Element) -> ET.Element:
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("name") == "dtype-doctor"
    return suites[0]


def test_junit_fails_errors_by_default():
    suite = _suite(_junit(full_report(trace=_trace())))
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("dtype-doctor.DD101", CONV),
        ("dtype-doctor.DD104", "<model>"),
        ("dtype-doctor.DD108", "resnet.embedder"),
    ]
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("errors") == "0"
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == DD101.message
    assert "DD101" in failure.get("type")
    assert "pixel_values float32@cpu[2,3,32,32]" in failure.text and "cast-inputs" in failure.text
    assert "source: prep.py:12" in failure.text and cases[0].get("file") is None  # the XSD has no file attribute
    # Below --fail-on: passing, but the text is there.
    assert cases[1].find("failure") is None and "int32" in cases[1].find("system-out").text


@pytest.mark.parametrize(("fail_on", "failures"), [("error", 1), ("warning", 2), ("info", 3), ("never", 0)])
def test_junit_failures_follow_fail_on(fail_on, failures):
    suite = _suite(_junit(full_report(trace=_trace()), fail_on=fail_on))
    assert suite.get("failures") == str(failures)
    assert len(suite.findall("testcase/failure")) == failures


def test_junit_groups_findings_by_code_and_module():
    second = replace(DD101, op="aten.addmm.default", message="Linear received float32 input but its weight is float16")
    suite = _suite(_junit(full_report(findings=(DD101, second), trace=_trace())))
    cases = suite.findall("testcase")
    assert len(cases) == 1
    assert "aten.addmm.default" in cases[0].find("failure").text
    assert "aten.convolution.default" in cases[0].find("failure").text


def test_junit_trace_failure_is_an_error_testcase():
    root = _junit(full_report())
    suite = _suite(root)
    trace = [c for c in suite.findall("testcase") if c.get("name") == "trace"]
    assert len(trace) == 1 and trace[0].find("error") is not None
    assert suite.get("errors") == "1" and root.get("errors") == "1"


def test_junit_without_findings_has_a_passing_scan_testcase():
    suite = _suite(_junit(clean_report()))
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [("dtype-doctor", "scan")]
    assert cases[0].find("failure") is None and "no dtype or device problems found" in cases[0].find("system-out").text
    assert suite.get("tests") == "1" and suite.get("failures") == "0"


def test_junit_fix_testcase_fails_when_not_verified():
    ok = _suite(_junit(full_report(trace=_trace(), fix=FIX_BLOCK)))
    fix_case = [c for c in ok.findall("testcase") if c.get("name") == "fix"][0]
    assert fix_case.find("failure") is None
    bad = _suite(_junit(full_report(trace=_trace(), fix=replace(FIX_BLOCK, verified=False))))
    fix_case = [c for c in bad.findall("testcase") if c.get("name") == "fix"][0]
    assert fix_case.find("failure") is not None and bad.get("failures") == "2"


# ----------------------------------------------------------------------------- markdown


def test_markdown_has_summary_table_rows_details_and_lineage():
    md = render(full_report(fix=FIX_BLOCK), "markdown")
    assert md.startswith("## dtype-doctor: `./models/tiny-resnet`")
    assert "**1 error, 1 warning, 1 info · 15 modules, 42 ops traced**" in md
    assert "| code | severity | module | op | stage | message |" in md
    assert (
        f"| DD101 | **error** | `{CONV}` | `aten.convolution.default` | formatter | "
        "Conv2d received float32 input but its weight is float16 |"
    ) in md
    assert "| DD104 | warning | `<model>` | `aten.nll_loss_forward.default` | dataset |" in md
    # A pipe and a tag in a message neither break the table nor vanish as HTML.
    assert "costs a copy) \\| see &lt;docs&gt; |" in md
    assert "| input | `pixel_values` | float32 | cpu | [2,3,32,32] |" in md
    assert "- `cast-inputs` (safe): cast pixel_values to float16 before the forward" in md
    assert "#### `pixel_values`" in md
    assert "| formatter | **uint8 → float32** | cpu | [2,3,32,32] | datasets TorchFormatter casts floating columns to float32 (prep.py:12) |" in md
    assert "| transfer | float32 | **cpu → cuda:0** |" in md
    assert "> **trace stopped**:" in md
    assert "### Fix" in md and "- **verified**: yes" in md and "- **patch**: fix.patch (prep.py)" in md


def test_markdown_clean_report_says_so():
    md = render(clean_report(), "markdown")
    assert "no dtype or device problems found." in md and "### Findings" not in md


def test_markdown_snapshot():
    check_snapshot("full.md", render(full_report(fix=FIX_BLOCK), "markdown"))


# ----------------------------------------------------------------------------- rich


def _console(width: int = 80) -> "Console":  # noqa: F821
    from rich.console import Console

    return Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None, _environ={})


def _rich(report: Report, width: int = 80, **kw) -> str:
    return render(report, "rich", width=width, **kw)


def test_rich_at_width_80_shows_codes_modules_lineage_change_and_summary():
    text = _rich(full_report())
    assert "\x1b[" not in text  # no colour unless asked
    for code in ("DD101", "DD104", "DD108"):
        assert code in text
    flat = "".join(text.split())  # module names may fold across lines at 80 columns
    assert CONV in flat and "<model>" in text and "resnet.embedder" in text
    assert "weightfloat16@cpu[8,3,7,7]" in flat  # the module's own weight, named relative to it
    # The formatter changed the dtype, the transfer the device: both marked.
    marked = [line.split()[:2] for line in text.splitlines() if line.lstrip().startswith("▸")]
    assert marked == [["▸", "formatter"], ["▸", "transfer"]]
    assert "formatter      float32@cpu[2,3,32,32]" in text
    assert "datasets TorchFormatter casts" in text
    assert "1 error, 1 warning, 1 info · 15 modules, 42 ops traced" in text
    assert "trace stopped" in text and "ops after this point were not traced" in text
    assert "cast-inputs" in text and "(safe)" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_rich_renders_at_any_width_without_overflow(width):
    text = _rich(full_report(fix=FIX_BLOCK), width=width)
    assert max(len(line) for line in text.splitlines()) <= width


def test_rich_clean_report_is_one_green_line():
    text = _rich(clean_report())
    assert "✓ no dtype or device problems found · 15 modules, 42 ops traced" in text
    assert "finding" not in text and "trace stopped" not in text
    coloured = _rich(clean_report(), color=True)
    assert "\x1b[" in coloured


def test_rich_prints_brackets_as_written_not_as_markup():
    target = replace(TARGET, model="./runs/[bold]exp[/bold]", dataset="data[train]")
    f = replace(DD101, message="shape [2, 3] vs [red]x[/red]", module="layers[0]")
    text = _rich(full_report(target=target, findings=(f,)), width=100)
    assert "./runs/[bold]exp[/bold]" in text and "data[train]" in text
    assert "shape [2, 3] vs [red]x[/red]" in text and "layers[0]" in text
    rule = replace(CATALOGUE[1], summary="Tensors [cpu] and [cuda] meet.")
    assert "Tensors [cpu] and [cuda] meet." in render_renderable(rules_table([rule]), width=100)


def test_rich_clean_but_stopped_does_not_claim_no_problems():
    text = _rich(Report((), TARGET, ENVIRONMENT, _trace(FAILURE)))
    assert "no dtype or device problems found" not in text
    assert "no findings, but the trace stopped early" in text


def test_rich_shows_the_fix_outcome():
    text = _rich(full_report(fix=FIX_BLOCK), width=100)
    assert "fix: cast-inputs" in text
    assert "✓ cast-inputs applied: pixel_values → float16 after the formatter" in text
    assert "– to-device skipped: inputs already on cuda:0" in text
    assert "verified" in text and "yes — the re-run trace is clean" in text
    assert "0 errors, 0 warnings, 1 info" in text
    assert "fix.patch (prep.py)" in text


def test_a_parity_that_could_not_be_measured_says_why_instead_of_a_blank_row():
    fix = replace(FIX_BLOCK, parity=Parity(error="RuntimeError: the reference failed"))
    text = _rich(full_report(fix=fix), width=100)
    assert "not measured: RuntimeError: the reference failed" in text


def test_the_fix_says_how_to_check_the_patch_and_what_it_leaves_out():
    patch = PatchOutcome("fix.patch", ("dtype_doctor_fix.py",), unwritten=("cast labels int32 → int64 (why)",),
                         check="dtype-doctor scan m d --preprocess dtype_doctor_fix.py:preprocess --preprocess-mode transform")
    text = _rich(full_report(fix=replace(FIX_BLOCK, patch=patch)), width=140)
    assert "left out  cast labels int32 → int64 (why)" in text
    assert "check     dtype-doctor scan m d --preprocess dtype_doctor_fix.py:preprocess --preprocess-mode transform" in text
    assert patch.to_dict()["check"].startswith("dtype-doctor scan") and patch.to_dict()["unwritten"] == list(patch.unwritten)


def test_rich_module_tree_shows_only_off_majority_modules():
    text = _rich(full_report(), width=100)
    assert "parameter dtypes" in text
    assert "classifier Sequential  float32 · 2 params" in text
    assert "resnet.encoder" not in text  # all float16: not shown


def test_rich_snapshots():
    check_snapshot("full-80.txt", _rich(full_report(), width=80))
    check_snapshot("full-fix-100.txt", _rich(full_report(fix=FIX_BLOCK, trace=_trace()), width=100))
    check_snapshot("clean-80.txt", _rich(clean_report(), width=80))


def test_print_report_writes_to_the_console():
    rich_console = _console(100)
    print_report(full_report(), "rich", rich_console)
    assert "DD101" in rich_console.file.getvalue()
    json_console = _console(20)  # machine formats are never wrapped to the console's width
    print_report(full_report(), "json", json_console)
    assert json.loads(json_console.file.getvalue())["findings"][0]["module"] == CONV


# ----------------------------------------------------------------------------- module tree


def test_dtype_tree_is_none_when_parameters_agree():
    model = ModelInfo("M", (StateTensor("a.weight", "parameter", "float16", "cpu", (4,)),), module_types=(("a", "Linear"),))
    assert dtype_tree(model) is None


def test_dtype_tree_folds_chains_and_merges_repeated_blocks():
    state = []
    types = [("", "T5ForConditionalGeneration"), ("encoder", "T5Stack"), ("encoder.block", "ModuleList")]
    for i in range(24):
        base = f"encoder.block.{i}.layer.1.DenseReluDense"
        types += [(f"encoder.block.{i}", "T5Block"), (base, "T5DenseActDense"), (f"{base}.wi", "Linear"), (f"{base}.wo", "Linear")]
        state += [
            StateTensor(f"{base}.wi.weight", "parameter", "float16", "cpu", (64, 64)),
            StateTensor(f"{base}.wo.weight", "parameter", "float32", "cpu", (16, 64)),
        ]
    state.append(StateTensor("encoder.final_layer_norm.weight", "parameter", "float32", "cpu", (16,)))
    types.append(("encoder.final_layer_norm", "T5LayerNorm"))
    model = ModelInfo("T5ForConditionalGeneration", tuple(state), keep_in_fp32_modules=("wo",), module_types=tuple(types))
    tree = dtype_tree(model)
    assert tree is not None and tree.majority == "float16" and tree.off_majority == 25
    (encoder,) = tree.root.children
    assert encoder.label == "encoder"
    labels = [c.label for c in encoder.children]
    assert labels == ["block.{0-23}.layer.1.DenseReluDense.wo", "final_layer_norm"]
    assert encoder.children[0].merged == 24 and encoder.children[0].kept_fp32
    text = render_renderable(_tree_of(model), width=100)
    assert "block.{0-23}.layer.1.DenseReluDense.wo Linear  float32 ×24 · kept fp32 by the model" in text
    assert "final_layer_norm T5LayerNorm  float32 · 1 param" in text


def test_dtype_tree_is_cut_short_for_big_models():
    state, types = [], [("", "M")]
    for i in range(40):
        types.append((f"head{i}", "Linear"))
        state += [
            StateTensor(f"head{i}.weight", "parameter", "float32", "cpu", (2,)),
            StateTensor(f"body{i}.weight", "parameter", "float16", "cpu", (64,)),
        ]
    text = render_renderable(_tree_of(ModelInfo("M", tuple(state), module_types=tuple(types))), width=80)
    assert "head11 " in text and "head12 " not in text
    assert "… 28 more modules not shown" in text


def _tree_of(model: ModelInfo):
    from dtype_doctor.report.console import module_tree

    return module_tree(dtype_tree(model))


def test_dtype_tree_lists_a_stray_parameter_of_a_mixed_module():
    model = ModelInfo(
        "M",
        (
            StateTensor("norm.weight", "parameter", "float32", "cpu", (8,)),
            StateTensor("norm.bias", "parameter", "float16", "cpu", (8,)),
            StateTensor("lin.weight", "parameter", "float16", "cpu", (8, 8)),
        ),
        module_types=(("", "M"), ("norm", "LayerNorm"), ("lin", "Linear")),
    )
    tree = dtype_tree(model)
    (norm,) = tree.root.children
    assert norm.label == "norm" and norm.module_type == "LayerNorm" and not norm.collapsed
    (weight,) = norm.children
    assert weight.label == "weight" and weight.module_type == "Parameter" and weight.dtypes == ("float32",)


# ----------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class StandInRule:
    code: str
    name: str
    severity: str
    summary: str
    why: str
    example: str
    fix: str
    fix_safety: str
    references: tuple[str, ...] = ()


CATALOGUE = (
    StandInRule(
        "DD101",
        "dtype-mismatch-in-op",
        "error",
        "Floating operands of different dtypes meet in an op that needs one dtype.",
        "PyTorch raises at the first such op, and only names the op.",
        "model = model.half()\nmodel(pixel_values=torch.rand(1, 3, 32, 32))  # float32 input [1, 3]",
        "Cast the inputs to the model's dtype, or run under autocast.",
        "Casting inputs is safe.",
        ("https://pytorch.org/docs/stable/amp.html",),
    ),
    StandInRule("DD201", "device-mismatch", "error", "Tensors on different devices meet in one op.", "", "", "", ""),
    StandInRule("DD108", "implicit-cast", "info", "The model silently casts an input.", "", "", "", ""),
)


def test_rules_table_lists_the_catalogue_sorted():
    text = render_renderable(rules_table(reversed(CATALOGUE)), width=100)
    lines = [line for line in text.splitlines() if line.strip().startswith("DD")]
    assert [line.split()[0] for line in lines] == ["DD101", "DD108", "DD201"]
    assert "device-mismatch" in text and "Tensors on different devices" in text


def test_rule_doc_has_every_section():
    text = render_renderable(rule_doc(CATALOGUE[0]), width=80)
    assert text.startswith("DD101 dtype-mismatch-in-op")
    for heading in ("What it flags", "Why it matters", "Example", "Fix", "Fix safety", "References"):
        assert heading in text
    assert "float32 input [1, 3]" in text  # code kept as written, not read as markup
    assert "https://pytorch.org/docs/stable/amp.html" in text
    # Empty sections are left out.
    short = render_renderable(rule_doc(CATALOGUE[1]), width=80)
    assert "Example" not in short and "References" not in short


# ----------------------------------------------------------------------------- any report

# Any text but the word the no-meta check looks for (a generated "META" is no simulated device leaking).
_words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60).filter(lambda s: "meta" not in s.lower())
_tensors = st.builds(
    TensorMeta,
    dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64", "int32", "int64", "bool"]),
    device=st.sampled_from(["cpu", "cuda:0", "cuda:1"]),  # a report never names "meta": simulated devices read as cuda:k
    shape=st.lists(st.integers(0, 4096), max_size=5).map(tuple),
    role=st.sampled_from(["input", "weight", "target", "mask"]),
    name=st.none() | _words,
)
_findings = st.builds(
    Finding,
    code=st.sampled_from(["DD101", "DD104", "DD201", "DD303"]),
    name=st.sampled_from(["dtype-mismatch-in-op", "device-mismatch"]),
    severity=st.sampled_from(["error", "warning", "info"]),
    message=_words,
    module=st.sampled_from(["", "a", "encoder.layer.0.attention.self.query"]) | _words,
    module_type=_words,
    op=st.none() | _words,
    stage=st.sampled_from(["dataset", "processor", "formatter", "model-code"]),
    tensors=st.lists(_tensors, max_size=3).map(tuple),
    source=st.none() | st.builds(SourceLoc, file=_words.filter(bool), line=st.integers(0, 10_000)),
    fixes=st.lists(st.builds(FixSuggestion, strategy=_words, applicability=st.sampled_from(["safe", "unsafe"]), description=_words), max_size=2).map(tuple),
    pytorch_error=st.none() | _words,
)


@settings(max_examples=60, deadline=None)
@given(findings=st.lists(_findings, max_size=4), width=st.integers(30, 200), fail_on=st.sampled_from(["error", "warning", "info", "never"]))
def test_any_report_renders_in_every_format(findings, width, fail_on):
    report = full_report(findings=tuple(findings))
    text = render(report, "rich", width=width)
    assert max(cell_len(line) for line in text.splitlines()) <= width
    assert "\x1b" not in text
    assert json.loads(render(report, "json"))["summary"]["error"] == sum(f.severity == "error" for f in findings)
    assert len(json.loads(render(report, "sarif"))["runs"][0]["results"]) == len(findings)
    suite = _suite(_junit(report, fail_on=fail_on))
    expected = len({(f.code, f.module) for f in findings if is_failing(f.severity, fail_on)})
    assert suite.get("failures") == str(expected)
    md = render(report, "markdown")
    table = [line for line in md.splitlines() if line.startswith("| DD")]
    assert len(table) == len(findings)
    # Every findings-table row has exactly six cells: nothing in a message breaks the table.
    assert all(len(re.split(r"(?<!\\)\|", row)) == 8 for row in table)
