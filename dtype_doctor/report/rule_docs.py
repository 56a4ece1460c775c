"""`dtype-doctor rules` and `dtype-doctor rule CODE`: the catalogue and one rule's page.

Rules are read by attribute (code, name, severity, summary, why, example, fix, fix_safety,
references), so anything shaped like `dtype_doctor.rules.base.Rule` renders.
"""

from __future__ import annotations

from typing import Any, Iterable

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from dtype_doctor.report.common import SEVERITY_STYLE

# The sections of a rule's page, in order: (heading, attribute), as ruff's docs order them;
# an empty or missing attribute leaves its section out.
RULE_SECTIONS = (
    ("What it flags", "summary"),
    ("Why it matters", "why"),
    ("Devices", "device_note"),  # which device's behaviour the rule judges, when CPU and CUDA differ
    ("Example", "example"),
    ("Fix", "fix"),
    ("Fix safety", "fix_safety"),
)


# Narrower than this, each rule's summary goes under its code and name at the full width,
# instead of in a fourth column a few words wide.
RULES_TABLE_MIN = 110


def rules_table(rules: Iterable[Any]) -> RenderableType:
    return _RulesTable(tuple(sorted(rules, key=lambda r: r.code)))


def rules_markdown(rules: Iterable[Any]) -> str:
    """The catalogue as a markdown table, code, name and default severity: the README's, which
    scripts/gen_readme_rules.py writes (`dtype-doctor rules --format markdown` prints it)."""
    rows = [f"| {r.code} | {r.name} | {r.severity} |" for r in sorted(rules, key=lambda r: r.code)]
    return "\n".join(["| code | name | default |", "|---|---|---|", *rows]) + "\n"


class _RulesTable:
    def __init__(self, rules: tuple[Any, ...]) -> None:
        self.rules = rules

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.max_width >= RULES_TABLE_MIN
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, show_lines=not wide)
        table.add_column("code", style="bold", no_wrap=True)
        if wide:
            table.add_column("name", no_wrap=True)
            table.add_column("severity", no_wrap=True)
        table.add_column("flags" if wide else "rule")
        for rule in self.rules:
            severity = getattr(rule, "severity", "")
            name = Text(getattr(rule, "name", ""))
            sev = Text(severity, style=SEVERITY_STYLE.get(severity, ""))
            flags = Text(getattr(rule, "summary", "") or "")
            if wide:
                table.add_row(Text(rule.code), name, sev, flags)
            else:
                table.add_row(Text(rule.code), Group(Text.assemble(name, " · ", sev), flags))
        yield table


def rule_doc(rule: Any) -> RenderableType:
    severity = getattr(rule, "severity", "")
    parts: list[RenderableType] = [
        Text.assemble(
            (rule.code, "bold"),
            " ",
            (getattr(rule, "name", ""), "bold"),
            "  ",
            (f"default severity {severity}", SEVERITY_STYLE.get(severity, "")),
        )
    ]
    for heading, attr in RULE_SECTIONS:
        value = getattr(rule, attr, None)
        if not value:
            continue
        parts.append(Text(f"\n{heading}", style="bold underline"))
        if attr == "example":
            parts.append(Padding(Syntax(str(value).strip("\n"), "python", word_wrap=True, theme="ansi_dark", background_color="default"), (0, 0, 0, 2)))
        else:
            parts.append(Padding(Text(str(value).strip()), (0, 0, 0, 2)))
    refs = tuple(getattr(rule, "references", ()) or ())
    if refs:
        parts.append(Text("\nReferences", style="bold underline"))
        parts += [Padding(Text(f"- {r}"), (0, 0, 0, 2)) for r in refs]
    return Group(*parts)
