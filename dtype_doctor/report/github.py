"""`--format github`: GitHub Actions workflow commands, one annotation per finding.

    ::error file=prep.py,line=26,title=DD101 dtype-mismatch-in-op::Conv2d received float16 …

error → `::error`, warning → `::warning`, info → `::notice`. A finding with a user source
line is annotated on that line (the file as the report names it, relative to where the scan
ran); the others appear in the run's summary. Values are escaped as the workflow-command
syntax requires (`%`, CR and LF in a message; also `:` and `,` in a property), so a
PyTorch message with a colon or several lines stays one annotation. The last line, plain
text, is the summary.
"""

from __future__ import annotations

from dtype_doctor.records import Finding, Report
from dtype_doctor.report.common import RenderOptions, failure_line, module_label, summary_line

_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def render(report: Report, options: RenderOptions) -> str:
    lines = [_annotation(f) for f in report.findings]
    failure = report.trace.failure if report.trace else None
    if failure is not None and options.fail_on != "never":
        lines.append(f"::error title={_property('dtype-doctor: trace stopped')}::{_data(failure_line(failure))}")
    lines.append(summary_line(report.summary))
    return "\n".join(lines) + "\n"


def _annotation(f: Finding) -> str:
    props = []
    if f.source is not None:
        props += [f"file={_property(f.source.file)}", f"line={f.source.line}"]
    props.append(f"title={_property(f'{f.code} {f.name}')}")
    where = module_label(f.module) + (f" ({f.module_type})" if f.module_type else "")
    message = f"{f.message}\n{where}" + (f"\npytorch: {f.pytorch_error}" if f.pytorch_error else "")
    return f"::{_LEVEL[f.severity]} {','.join(props)}::{_data(message)}"


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
