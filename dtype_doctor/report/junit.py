"""`--format junit`: JUnit XML, for CI systems that show test results (GitLab, Jenkins, Azure, …).

One testsuite `dtype-doctor`; one testcase per (rule code, module), named
`dtype-doctor.CODE` / module. A testcase fails (`<failure>`) when its most severe finding is
at or above `--fail-on` (default `error`), so the red tests are exactly what makes the exit
code 1; findings below it are passing testcases whose text is in `<system-out>`, visible but
not red. A trace that stopped early is an `<error>` testcase `dtype-doctor.trace` (unless
`--fail-on never`); `dtype-doctor fix` adds a `dtype-doctor.fix` testcase that fails when
the re-run trace was not clean. With no findings a passing `dtype-doctor.scan` testcase says so.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from dtype_doctor.fix.outcome import FixOutcome
from dtype_doctor.records import SEVERITY_RANK, Finding, Report
from dtype_doctor.report.common import (
    FAILURE_NOTE,
    FIX_NOT_VERIFIED,
    NO_PROBLEMS,
    TOOL_NAME,
    RenderOptions,
    failure_line,
    fix_fields,
    fix_label,
    fix_steps,
    is_failing,
    module_label,
    source_label,
    summary_line,
    tensor_label,
)


def render(report: Report, options: RenderOptions) -> str:
    suite = ET.Element("testsuite", name=TOOL_NAME)
    failures = errors = 0

    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in report.findings:
        groups.setdefault((f.code, f.module), []).append(f)
    for (code, module), findings in groups.items():
        case = ET.SubElement(suite, "testcase", classname=f"{TOOL_NAME}.{code}", name=module_label(module))
        # No file/line attributes: the JUnit XSD (Jenkins xunit, as pytest validates against) has
        # none on a testcase; the user's line is in the text (`source: prep.py:12`).
        worst = max(findings, key=lambda f: SEVERITY_RANK[f.severity])
        text = "\n\n".join(_finding_text(f) for f in findings)
        if is_failing(worst.severity, options.fail_on):
            failures += 1
            failure = ET.SubElement(case, "failure", message=worst.message, type=f"{code} {worst.name}")
            failure.text = text
        else:
            ET.SubElement(case, "system-out").text = text

    failure = report.trace.failure if report.trace else None
    if failure is not None:
        case = ET.SubElement(suite, "testcase", classname=TOOL_NAME, name="trace")
        if is_failing("error", options.fail_on):
            errors += 1
            err = ET.SubElement(case, "error", message=failure.message, type=f"{failure.kind} error")
            err.text = f"{failure_line(failure)}\n{FAILURE_NOTE}"
        else:
            ET.SubElement(case, "system-out").text = failure_line(failure)

    if report.fix is not None:
        case = ET.SubElement(suite, "testcase", classname=TOOL_NAME, name="fix")
        text = _fix_text(report.fix)
        if not report.fix.verified:
            failures += 1
            ET.SubElement(case, "failure", message=FIX_NOT_VERIFIED, type="fix").text = text
        else:
            ET.SubElement(case, "system-out").text = text

    if not report.findings:
        case = ET.SubElement(suite, "testcase", classname=TOOL_NAME, name="scan")
        ET.SubElement(case, "system-out").text = f"{NO_PROBLEMS} · {summary_line(report.summary)}"

    tests = len(suite.findall("testcase"))
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", "0")
    root = ET.Element("testsuites", name=TOOL_NAME, tests=str(tests), failures=str(failures), errors=str(errors))
    root.append(suite)
    _strip_invalid_chars(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _finding_text(f: Finding) -> str:
    lines = [f"{f.severity} {f.code} {f.name}: {f.message}", f"module: {module_label(f.module)}"]
    if f.module_type:
        lines[-1] += f" ({f.module_type})"
    if f.op:
        lines.append(f"op: {f.op}")
    lines.append(f"stage: {f.stage}")
    if f.source:
        lines.append(f"source: {source_label(f.source)}")
    lines += [f"tensor: {t.role} {tensor_label(t)}" for t in f.tensors]
    if f.pytorch_error:
        lines.append(f"pytorch: {f.pytorch_error}")
    lines += [f"fix: {fix_label(x)}" for x in f.fixes]
    return "\n".join(lines)


def _fix_text(fix: FixOutcome) -> str:
    lines = [f"strategy: {fix.strategy}"]
    lines += [f"{s.mark} {s.strategy} {s.status}" + (f": {s.detail}" if s.detail else "") for s in fix_steps(fix)]
    lines += [f"{label}: {value}" for label, value in fix_fields(fix)]
    return "\n".join(lines)


# Characters XML 1.0 cannot hold at all (a PyTorch message with an ANSI escape would make
# the whole file unparseable).
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _strip_invalid_chars(root: ET.Element) -> None:
    for el in root.iter():
        if el.text:
            el.text = _INVALID_XML.sub("", el.text)
        for key, value in el.attrib.items():
            el.set(key, _INVALID_XML.sub("", value))
