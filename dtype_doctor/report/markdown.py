"""`--format markdown`: a report for a GitHub pull-request comment, job summary or issue.

Heading and summary line, one table of all findings, then each finding's tensors and fixes,
the trace failure if any, each input's lineage, and the fix outcome for `dtype-doctor fix`.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from dtype_doctor.fix.outcome import FixOutcome
from dtype_doctor.records import Finding, Report
from dtype_doctor.report.common import (
    FAILURE_NOTE,
    FAILURE_TITLE,
    NO_PROBLEMS,
    NO_PROBLEMS_BUT_STOPPED,
    TOOL_NAME,
    RenderOptions,
    component_rows,
    environment_line,
    failure_line,
    fix_fields,
    fix_outcome,
    fix_steps,
    lineage_rows,
    load_fields,
    module_label,
    shape_label,
    source_label,
    summary_line,
    target_fields,
    tensor_name,
)


# Control characters other than line breaks mean nothing in Markdown and upset some viewers.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x7f]")


def render(report: Report, options: RenderOptions) -> str:
    out: list[str] = [f"## {TOOL_NAME}: {_code(report.target.model)}", ""]
    summary = report.summary
    from dtype_doctor.report.suppress import counted

    held = counted(report.suppressed)
    out += [f"**{summary_line(summary)}**" + (f" · {held}" if held else ""), ""]
    if report.fix is not None:
        verified, outcome, before = fix_outcome(report.fix, summary)
        out += [f"**{'✓' if verified else '✗'} {outcome}** ({before})", ""]
    out += [f"- **{label}**: {_text(value)}" for label, value in [*target_fields(report), *load_fields(report.target)]]
    env = environment_line(report.environment)
    if env:
        out.append(f"- **environment**: {_text(env)}")
    out.append("")

    if report.target.components:
        out += ["### Pipeline components", ""]
        out += _table(("component", "class", "dtype", "device", "parameters"),
                      ((_code(n), _text(c), d, _text(dev), p) for n, c, d, dev, p in component_rows(report.target)))

    failure = report.trace.failure if report.trace else None
    if failure is not None:
        out += [f"> **{FAILURE_TITLE}**: {_text(failure_line(failure))}  ", f"> {FAILURE_NOTE}", ""]

    if report.findings:
        out += ["### Findings", ""]
        out += _table(
            ("code", "severity", "module", "op", "stage", "message"),
            (
                (f.code, _severity(f.severity), _code(module_label(f.module)), _code(f.op) if f.op else "", f.stage, _text(f.message))
                for f in report.findings
            ),
        )
        for i, f in enumerate(report.findings, 1):
            out += _details(i, f)
    else:
        out += [f"{NO_PROBLEMS_BUT_STOPPED if failure else NO_PROBLEMS}.", ""]

    out += _value_ranges(report, options.plot)

    if report.lineage:
        out += ["### Lineage", ""]
        blamed = report.blamed()
        for name, steps in report.lineage.items():
            out += [f"#### {_code(name)}", ""]
            rows = []
            for row in lineage_rows(steps, blamed.get(name)):
                dtype = f"**{_text(row.dtype_text())}**" if row.dtype_changed else _text(row.dtype_text())
                device = f"**{_text(row.device_text())}**" if row.device_changed else _text(row.device_text())
                rows.append((row.step.stage, dtype, device, shape_label(row.step.shape), _text(row.detail_text())))
            out += _table(("stage", "dtype", "device", "shape", "detail"), rows)

    if report.fix is not None:
        out += _fix(report.fix)
    return "\n".join(out).rstrip("\n") + "\n"


def _value_ranges(report: Report, plot: str | None) -> list[str]:
    """The --plot picture, embedded, and the modules beyond fp16's range, when values were measured."""
    from dtype_doctor.report.ranges import module_ranges

    ranges = module_ranges(report.trace)
    if not ranges:
        return []
    out = ["### Value ranges", ""]
    if plot:
        out += [f"![each module's smallest and peak |x| against fp16's and bf16's limits]({plot.replace(' ', '%20')})", ""]
    over = [r for r in ranges if r.beyond_fp16 or r.below_fp16_normal]
    out.append(f"{len(ranges)} modules measured; {sum(r.beyond_fp16 for r in ranges)} beyond float16's 65504, "
               f"{sum(r.below_fp16_normal for r in ranges)} with values below its smallest normal 6.1e-5.")
    out.append("")
    if over:
        out += _table(("module", "smallest non-zero \\|x\\|", "peak \\|x\\|", "in fp16"),
                      ((_code(r.name), f"{r.smallest:.3g}" if r.smallest else "", f"{r.peak:.4g}", r.verdict) for r in over))
    return out


def _details(i: int, f: Finding) -> list[str]:
    where = _code(module_label(f.module)) + (f" ({f.module_type})" if f.module_type else "")
    out = [f"#### {i}. {f.code} `{f.name}` ({f.severity}) in {where}", "", _text(f.message), ""]
    facts = []
    if f.op:
        facts.append(f"- op: {_code(f.op)}")
    facts.append(f"- stage: {f.stage}")
    if f.source:
        facts.append(f"- source: {_code(source_label(f.source) or '')}")
    if f.pytorch_error:
        facts.append(f"- PyTorch: {_code(f.pytorch_error)}")
    out += facts + [""]
    if f.tensors:
        out += _table(
            ("role", "name", "dtype", "device", "shape"),
            ((t.role, _code(tensor_name(t)), t.dtype, t.device, shape_label(t.shape)) for t in f.tensors),
        )
    if f.fixes:
        out += ["Fixes:", ""]
        out += [f"- {_code(x.strategy)} ({x.applicability}): {_text(x.description)}" for x in f.fixes]
        out.append("")
    return out


def _fix(fix: FixOutcome) -> list[str]:
    out = ["### Fix", ""]
    if fix.strategy:
        out.append(f"- **strategy**: {_code(fix.strategy)}")
    for s in fix_steps(fix):
        detail = f": {_text(s.detail)}" if s.detail else ""
        out.append(f"- {s.mark} {_code(s.strategy)} {s.status}{detail}")
    out += [f"- **{label}**: {_text(value)}" for label, value in fix_fields(fix)]
    out.append("")
    return out


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _severity(severity: str) -> str:
    return f"**{severity}**" if severity == "error" else severity


def _cell(s: str) -> str:
    """One table cell: every kind of line break (\\r, \\x1e, \\u2028 …) would end the row."""
    return "<br>".join(s.splitlines()).replace("|", "\\|")


def _text(s: str) -> str:
    """Prose that must not turn into HTML tags or emphasis (`<model>`, `*args`)."""
    s = _CONTROL.sub("", s)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _code(s: str) -> str:
    fence = "``" if "`" in s else "`"
    pad = " " if "`" in s else ""
    return f"{fence}{pad}{s}{pad}{fence}"
