"""`--format sarif`: SARIF 2.1.0 that GitHub code scanning ingests, and other SARIF viewers read.

What GitHub requires of an upload (its "SARIF support for code scanning" reference, and the
limits on results) is met here, not left to the uploader:

- every result has a `physicalLocation` with a relative `artifactLocation.uri` and a full
  `region`: the user's line when the lineage found it; else the model's `config.json` (at its
  dtype line when it has one) or the script that was run; else the dataset file; else
  ./pyproject.toml, where the check is configured. Each result also names its module as a
  logical location;
- `partialFingerprints.primaryLocationLineHash` is the finding's own fingerprint (rule, module,
  op, stage, tensors: see `Finding.fingerprint`), so an alert stays one alert when lines move
  and when the batch or the measured values change; `dtypeDoctor/v1` carries it whole;
- every rule has `shortDescription`, `fullDescription` and `help` (text and markdown) within
  GitHub's 1,024 characters, and a `helpUri` to its page in the docs;
- at most 25,000 results a run, the most severe kept, and under 10 MB gzip-compressed: beyond
  either, the rest are dropped and a notification says how many.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable

from dtype_doctor import __version__
from dtype_doctor.records import SEVERITY_RANK, Finding, Report
from dtype_doctor.report.common import (
    MODEL_BOUNDARY,
    SARIF_LEVEL,
    TOOL_NAME,
    RenderOptions,
    failure_line,
    humanize,
    json_default,
    rule_description,
    rule_for,
)

FORMAT = "sarif"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_VERSION = "2.1.0"
# GitHub's limits on an upload: results in a run (rejected above), the gzip-compressed file,
# the description texts it shows (characters), tags on a rule.
MAX_RESULTS = 25_000
MAX_GZIP_BYTES = 10 * 1000 * 1000
MAX_DESCRIPTION = 1024
MAX_TAGS = 20
# Where each rule's page lives: DTYPE_DOCTOR_DOCS_URL (e.g. the published docs site, or a
# repository's blob URL of docs/rules.md) + `#dd101`; by default the page in this repository.
DOCS_URL_ENV = "DTYPE_DOCTOR_DOCS_URL"
DEFAULT_RULES_PAGE = "docs/rules.md"
_PROBLEM_SEVERITY = {"error": "error", "warning": "warning", "info": "recommendation"}


def render(report: Report, options: RenderOptions) -> str:
    return json.dumps(sarif_log(report, options), indent=2, default=json_default) + "\n"


def rule_help_uri(code: str) -> str:
    """The rule's page: `{DTYPE_DOCTOR_DOCS_URL or docs/rules.md}#dd101`."""
    base = os.environ.get(DOCS_URL_ENV) or DEFAULT_RULES_PAGE
    return f"{base.rstrip('#')}#{code.lower()}"


def sarif_log(report: Report, options: RenderOptions) -> dict[str, Any]:
    findings, dropped = _within_result_limit(report.findings)
    rules = _rules(findings, options.rules)
    index = {r["id"]: i for i, r in enumerate(rules)}
    locator = Locator(report)
    seen: dict[tuple[str, str], int] = {}
    results = [_result(f, index[f.code], locator, seen) for f in findings]
    run: dict[str, Any] = {
        "tool": {"driver": _driver(rules)},
        "invocations": [_invocation(report, dropped)],
        "results": results,
        "properties": {"target": report.target.to_dict(), "summary": report.summary},
    }
    if report.suppressed:
        run["properties"]["suppressed"] = len(report.suppressed)
    if report.fix is not None:
        run["properties"]["fix"] = report.fix.to_dict()
    log = {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
    return _within_size_limit(log)


# ----------------------------------------------------------------------------- rules


def _rules(findings: Iterable[Finding], catalogue: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Every rule of the catalogue when the caller has it (GitHub keeps rules across runs), then
    any code a finding has that the catalogue lacks; else the codes that occur."""
    firsts: dict[str, Finding] = {}
    for f in findings:
        firsts.setdefault(f.code, f)
    out = [_rule(r.code, r.name, catalogue) for r in catalogue]
    known = {r.code for r in catalogue}
    out += [_rule(code, f.name, catalogue) for code, f in firsts.items() if code not in known]
    return out


def _rule(code: str, name: str, catalogue: tuple[Any, ...]) -> dict[str, Any]:
    rule = rule_for(code, catalogue)
    short = rule_description(code, name, catalogue)
    why = (getattr(rule, "why", "") or "").strip()
    fix = (getattr(rule, "fix", "") or "").strip()
    d: dict[str, Any] = {
        "id": code,
        "name": name[:255],
        "shortDescription": {"text": _cut(short)},
        "fullDescription": {"text": _cut(why or short)},
        "help": {"text": _cut(fix or short, 10 * MAX_DESCRIPTION), "markdown": _help_markdown(code, name, short, why, fix)},
        "helpUri": rule_help_uri(code),
    }
    severity = getattr(rule, "severity", None)
    if severity in SARIF_LEVEL:
        d["defaultConfiguration"] = {"level": SARIF_LEVEL[severity]}
    family = f"{code[:3]}xx" if code[:2] == "DD" else None
    tags = ["dtype", *([family] if family else [])]
    d["properties"] = {"tags": tags[:MAX_TAGS], "precision": "high",
                       "problem.severity": _PROBLEM_SEVERITY.get(severity or "", "warning")}
    return d


def _help_markdown(code: str, name: str, short: str, why: str, fix: str) -> str:
    parts = [f"**{code} {name}**: {short}"]
    if why:
        parts.append(why)
    if fix:
        parts.append(f"**Fix.** {fix}")
    parts.append(f"[{code} in the rule catalogue]({rule_help_uri(code)}) · `dtype-doctor rule {code}`")
    return "\n\n".join(parts)


def _cut(text: str, limit: int = MAX_DESCRIPTION) -> str:
    text = " ".join(text.split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----------------------------------------------------------------------------- results


def _result(f: Finding, rule_index: int, locator: "Locator", seen: dict[tuple[str, str], int]) -> dict[str, Any]:
    fq_name = f.module or locator.model_class or MODEL_BOUNDARY
    uri, region = locator.locate(f)
    location = {
        "physicalLocation": {"artifactLocation": {"uri": uri}, "region": region},
        "logicalLocations": [{"name": fq_name.rpartition(".")[2], "fullyQualifiedName": fq_name, "kind": "module"}],
    }
    properties: dict[str, Any] = {
        "name": f.name,
        "module": f.module,
        "module_type": f.module_type,
        "op": f.op,
        "stage": f.stage,
        "tensors": [t.to_dict() for t in f.tensors],
        "fixes": [x.to_dict() for x in f.fixes],
    }
    if f.source is None:
        properties["location_note"] = "no line of your code introduced it; located at " + uri
    if f.pytorch_error:
        properties["pytorch_error"] = f.pytorch_error
    fingerprint = f.fingerprint
    # GitHub reads `primaryLocationLineHash` as `hash:occurrence` within the file and rule.
    key = (uri, fingerprint)
    seen[key] = seen.get(key, 0) + 1
    return {
        "ruleId": f.code,
        "ruleIndex": rule_index,
        "level": SARIF_LEVEL[f.severity],
        "message": {"text": f.message.strip() or humanize(f.name)},
        "locations": [location],
        "partialFingerprints": {"primaryLocationLineHash": f"{fingerprint[:16]}:{seen[key]}", "dtypeDoctor/v1": fingerprint},
        "properties": properties,
    }


def _invocation(report: Report, dropped: int) -> dict[str, Any]:
    invocation: dict[str, Any] = {"executionSuccessful": True}
    notes = []
    if report.trace and report.trace.failure:
        notes.append({"level": "error", "message": {"text": failure_line(report.trace.failure)}})
    if dropped:
        notes.append({"level": "warning", "message": {"text": f"{dropped} less severe result(s) left out: code scanning "
                                                              f"accepts at most {MAX_RESULTS:,} a run"}})
    if notes:
        invocation["toolExecutionNotifications"] = notes
    return invocation


def _within_result_limit(findings: tuple[Finding, ...]) -> tuple[tuple[Finding, ...], int]:
    """The findings, or the MAX_RESULTS most severe of them in their order, and how many went."""
    if len(findings) <= MAX_RESULTS:
        return findings, 0
    ranked = sorted(range(len(findings)), key=lambda i: (-SEVERITY_RANK[findings[i].severity], i))
    keep = sorted(ranked[:MAX_RESULTS])
    return tuple(findings[i] for i in keep), len(findings) - MAX_RESULTS


def _within_size_limit(log: dict[str, Any]) -> dict[str, Any]:
    """Under GitHub's 10 MB gzip limit: first the results' property bags go, then results."""
    def size() -> int:
        text = json.dumps(log, default=json_default).encode()
        return len(text) if len(text) <= MAX_GZIP_BYTES else len(gzip.compress(text, compresslevel=6))

    if size() <= MAX_GZIP_BYTES:  # the JSON itself is under the limit: so is its gzip
        return log
    run = log["runs"][0]
    for r in run["results"]:
        r.pop("properties", None)
    before = len(run["results"])
    while size() > MAX_GZIP_BYTES and run["results"]:
        run["results"] = run["results"][: len(run["results"]) * 9 // 10]
    gone = before - len(run["results"])
    notes = run["invocations"][0].setdefault("toolExecutionNotifications", [])
    notes.append({"level": "warning", "message": {"text": f"result properties left out to stay under code scanning's "
                                                          f"{MAX_GZIP_BYTES // 10**6} MB; {gone} result(s) left out as well"}})
    return log


# ----------------------------------------------------------------------------- locations


class Locator:
    """Where in the repository a finding points: a file and a region GitHub can show."""

    def __init__(self, report: Report, root: Path | None = None) -> None:
        self.root = (root or Path.cwd()).resolve()
        self.model_class = report.trace.model.class_name if report.trace else ""
        self._read: dict[str, tuple[str, ...] | None] = {}
        self.fallback = self._fallback(report.target.model, report.target.dataset)

    def locate(self, f: Finding) -> tuple[str, dict[str, int]]:
        if f.source is not None:
            return self.uri(f.source.file), self.region(f.source.file, max(f.source.line, 1))
        uri, path, line = self.fallback
        return uri, self.region(path, line) if path else {"startLine": 1, "startColumn": 1, "endLine": 1, "endColumn": 1}

    def _fallback(self, model: str | None, dataset: str | None) -> tuple[str, str | None, int]:
        """(uri, file, line) for findings no line of the user's code introduced."""
        for spec in (model, dataset):
            if not spec:
                continue
            p = Path(spec).expanduser()
            if p.is_dir():
                config = p / "config.json"
                if config.is_file():
                    return self.uri(str(config)), str(config), self._dtype_line(config)
                first = _first_file(p)
                if first is not None:
                    return self.uri(str(first)), str(first), 1
            elif p.is_file():
                return self.uri(str(p)), str(p), 1
            elif spec.startswith("python "):  # run's target: "python train.py ARGS"
                words = spec.split()
                if len(words) > 1 and Path(words[1]).is_file():
                    return self.uri(words[1]), words[1], 1
        pyproject = self.root / "pyproject.toml"
        if pyproject.is_file():
            return "pyproject.toml", str(pyproject), 1
        return (model or dataset or "pyproject.toml").replace("\\", "/"), None, 1

    def uri(self, path: str) -> str:
        """Relative to the repository root (the working directory) where it lies inside it;
        relative paths stay as written; anything else an absolute file URI."""
        posix = path.replace("\\", "/")
        absolute = PurePosixPath(posix).is_absolute() or PureWindowsPath(path).is_absolute()
        if not absolute:
            return str(PurePosixPath(posix)).removeprefix("./")
        try:
            return Path(path).resolve().relative_to(self.root).as_posix()
        except (ValueError, OSError):
            pass
        if PureWindowsPath(path).is_absolute() and not PurePosixPath(posix).is_absolute():
            return PureWindowsPath(path).as_uri()
        return PurePosixPath(posix).as_uri()

    def region(self, path: str, line: int) -> dict[str, int]:
        """The whole line as GitHub's required region; an empty region at its start when the file cannot be read."""
        lines = self._lines(path)
        text = lines[line - 1] if lines is not None and 1 <= line <= len(lines) else None
        end = len(text) + 1 if text is not None else 1
        return {"startLine": line, "startColumn": 1, "endLine": line, "endColumn": end}

    def _lines(self, path: str) -> tuple[str, ...] | None:
        if path not in self._read:
            try:
                p = Path(path)
                ok = p.is_file() and p.stat().st_size <= 16 * 2**20  # a FIFO or a huge file is not read
                self._read[path] = tuple(p.read_text(encoding="utf-8", errors="replace").splitlines()) if ok else None
            except OSError:
                self._read[path] = None
        return self._read[path]

    def _dtype_line(self, config: Path) -> int:
        """The line of config.json that says the checkpoint's dtype, where most model-level findings start."""
        for i, text in enumerate(self._lines(str(config)) or (), start=1):
            if '"torch_dtype"' in text or '"dtype"' in text:
                return i
        return 1


def _first_file(folder: Path) -> Path | None:
    for name in ("dataset_info.json", "state.json", "dataset_dict.json"):
        if (folder / name).is_file():
            return folder / name
    try:
        return next((p for p in sorted(folder.rglob("*")) if p.is_file()), None)
    except OSError:
        return None


def _driver(rules: list[dict[str, Any]]) -> dict[str, Any]:
    driver: dict[str, Any] = {"name": TOOL_NAME, "version": __version__, "rules": rules}
    base = os.environ.get(DOCS_URL_ENV)
    if base and "://" in base:
        driver["informationUri"] = base.split("#")[0]
    return driver
