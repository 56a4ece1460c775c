"""`--format sarif`: SARIF 2.1.0, for GitHub code scanning and other SARIF viewers.

One reportingDescriptor per rule code that occurs; each finding a result located in the
user's file when the lineage found the line, and always by its module as a logical location.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from dtype_doctor import __version__
from dtype_doctor.records import Finding, Report, SourceLoc
from dtype_doctor.report.common import (
    MODEL_BOUNDARY,
    SARIF_LEVEL,
    TOOL_NAME,
    RenderOptions,
    failure_line,
    json_default,
    rule_description,
    rule_for,
)

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"


def render(report: Report, options: RenderOptions) -> str:
    return json.dumps(sarif_log(report, options), indent=2, default=json_default) + "\n"


def sarif_log(report: Report, options: RenderOptions) -> dict[str, Any]:
    codes: dict[str, Finding] = {}
    for f in report.findings:
        codes.setdefault(f.code, f)
    rule_ids = list(codes)
    model_name = report.trace.model.class_name if report.trace else ""
    invocation: dict[str, Any] = {"executionSuccessful": True}
    if report.trace and report.trace.failure:
        invocation["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": failure_line(report.trace.failure)}}
        ]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": TOOL_NAME,
                "version": __version__,
                "rules": [_rule(f, options.rules) for f in codes.values()],
            }
        },
        "invocations": [invocation],
        "results": [_result(f, rule_ids.index(f.code), model_name) for f in report.findings],
        "properties": {"target": report.target.to_dict(), "summary": report.summary},
    }
    if report.fix is not None:
        run["properties"]["fix"] = report.fix.to_dict()
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def _rule(first: Finding, catalogue: tuple[Any, ...]) -> dict[str, Any]:
    rule = rule_for(first.code, catalogue)
    d: dict[str, Any] = {
        "id": first.code,
        "name": first.name,
        "shortDescription": {"text": rule_description(first.code, first.name, catalogue)},
    }
    if rule is not None:
        if getattr(rule, "why", None):
            d["fullDescription"] = {"text": rule.why}
        if getattr(rule, "fix", None):
            d["help"] = {"text": rule.fix}
        if getattr(rule, "severity", None) in SARIF_LEVEL:
            d["defaultConfiguration"] = {"level": SARIF_LEVEL[rule.severity]}
        refs = tuple(getattr(rule, "references", ()) or ())
        if refs:
            d["helpUri"] = refs[0]
    return d


def _result(f: Finding, rule_index: int, model_name: str) -> dict[str, Any]:
    fq_name = f.module or model_name or MODEL_BOUNDARY
    location: dict[str, Any] = {}
    if f.source is not None:
        location["physicalLocation"] = _physical(f.source)
    location["logicalLocations"] = [
        {"name": fq_name.rpartition(".")[2], "fullyQualifiedName": fq_name, "kind": "module"}
    ]
    properties: dict[str, Any] = {
        "name": f.name,
        "module": f.module,
        "module_type": f.module_type,
        "op": f.op,
        "stage": f.stage,
        "tensors": [t.to_dict() for t in f.tensors],
        "fixes": [x.to_dict() for x in f.fixes],
    }
    if f.pytorch_error:
        properties["pytorch_error"] = f.pytorch_error
    fingerprint = hashlib.sha256("\0".join((f.code, f.module, f.op or "", f.stage)).encode()).hexdigest()
    return {
        "ruleId": f.code,
        "ruleIndex": rule_index,
        "level": SARIF_LEVEL[f.severity],
        "message": {"text": f.message},
        "locations": [location],
        "partialFingerprints": {"dtypeDoctor/v1": fingerprint[:32]},
        "properties": properties,
    }


def _physical(source: SourceLoc) -> dict[str, Any]:
    physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(source.file)}}
    if source.line >= 1:
        physical["region"] = {"startLine": source.line}
    return physical


def _uri(path: str) -> str:
    """Relative paths stay relative (viewers resolve them against the repository); absolute ones become file URIs."""
    if PurePosixPath(path).is_absolute():
        return PurePosixPath(path).as_uri()
    if PureWindowsPath(path).is_absolute():
        return PureWindowsPath(path).as_uri()
    return path.replace("\\", "/")
