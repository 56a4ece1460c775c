"""`--format rich`: the report a person reads in a terminal.

Header (what was traced), the trace failure if the forward stopped, one table row per finding
(with its tensors and fixes), each input's lineage with the stage that changed it
highlighted, the modules whose parameters are off the model's majority dtype, the fix outcome
for `dtype-doctor fix`, and a summary line. Everything is built from Text objects, never
markup strings, so a `[2, 3]` or `<model>` in a message prints as written.
"""

from __future__ import annotations

import io
import re
from typing import Any, Mapping

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from dtype_doctor import __version__
from dtype_doctor.fix.outcome import FixOutcome
from dtype_doctor.records import Finding, Report
from dtype_doctor.report.common import (
    APPLICABILITY_STYLE,
    CHANGED_MARK,
    FAILURE_NOTE,
    FAILURE_TITLE,
    FIX_STATUS_STYLE,
    LineageRow,
    NO_PROBLEMS,
    NO_PROBLEMS_BUT_STOPPED,
    SEVERITY_STYLE,
    TOOL_NAME,
    UNKNOWN,
    RenderOptions,
    component_rows,
    counts_line,
    coverage_line,
    precision_line,
    requested_line,
    dtype_style,
    environment_line,
    failure_line,
    fix_fields,
    fix_outcome,
    fix_steps,
    lineage_rows,
    load_fields,
    module_label,
    partial_trace,
    plural,
    shape_label,
    source_label,
    target_fields,
    tensor_name,
    traced_line,
    values_note,
)
from dtype_doctor.report.dtype_tree import DtypeNode, DtypeTree, dtype_tree
from dtype_doctor.report.ranges import range_strip

FORMAT = "rich"  # the name --format knows this module by

# Off-majority tree leaves shown before the tree says "… N more"; keeps big models to a screen.
TREE_LEAVES = 12


def render(report: Report, options: RenderOptions) -> str:
    return render_text(report_renderable(report), width=options.width, color=options.color)


def render_text(renderable: RenderableType, *, width: int, color: bool) -> str:
    """`renderable` laid out at `width`; plain text carries no padding at line ends."""
    console = make_console(width=width, color=color)
    console.print(renderable)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return text if color else "\n".join(line.rstrip() for line in text.split("\n"))


# Control characters rich lays out as zero-width; a terminal would act on them (an ESC in a
# PyTorch message starts an escape sequence), so they are dropped after layout.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


class Printable:
    """A renderable the console report and the compare report print (text without control characters)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            if segment.control or not _CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(_CONTROL.sub("", segment.text), segment.style)


def make_console(*, width: int, color: bool) -> Console:
    """A console that writes to a string, the same on every machine whatever the environment says."""
    return Console(
        file=io.StringIO(),
        width=width,
        force_terminal=color,
        color_system="truecolor" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
        legacy_windows=False,
        force_jupyter=False,
        force_interactive=False,
        _environ={},
    )


def report_renderable(report: Report) -> RenderableType:
    parts: list[RenderableType] = [header(report)]
    failure = report.trace.failure if report.trace else None
    if failure is not None:
        parts.append(
            Panel(
                Text.assemble((failure_line(failure), "red"), "\n", (FAILURE_NOTE, "dim")),
                title=Text(FAILURE_TITLE, style="bold red"),
                title_align="left",
                border_style="red",
            )
        )
    sections: list[RenderableType] = []
    if report.target.components:
        sections.append(components_table(report))
    if report.findings:
        sections.append(findings_table(report.findings))
    if report.lineage:
        sections.append(lineage_view(report.lineage, report.blamed()))
    strip = range_strip(report)
    if strip is not None:
        sections.append(strip)
    tree = dtype_tree(report.trace.model) if report.trace else None
    if tree is not None:
        sections.append(module_tree(tree))
    if report.fix is not None:
        sections.append(fix_panel(report.fix))
    if report.trace is not None and report.trace.stand_ins:
        sections.append(stand_ins_table(report))
    if report.trace is not None and report.trace.writes:
        sections.append(writes_table(report))
    for line in (requested_line(report), precision_line(report), coverage_line(report)):
        if line is not None:
            sections.append(Text(line, style="dim"))
    sections.append(summary(report))
    for section in sections:
        parts += [Text(), section]
    return Printable(Group(*parts))


def header(report: Report) -> Panel:
    fields = target_fields(report)
    # model and dataset a line each (and the loaded dtype and attention, where known); the short
    # fields two to a line, so the header is compact at any width, and the first labels line up.
    long_fields, pairs = [*fields[:2], *load_fields(report.target)], fields[2:]
    first_labels = [label for label, _ in long_fields] + [label for label, _ in pairs[::2]]
    width = max(len(label) for label in first_labels)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True, width=width)
    grid.add_column(overflow="fold")
    for label, value in long_fields:
        grid.add_row(label, Text(value))
    short = Table.grid(padding=(0, 2))
    short.add_column(style="bold", no_wrap=True, width=width)
    short.add_column()
    short.add_column(style="bold", no_wrap=True)
    short.add_column()
    for i in range(0, len(pairs), 2):
        row: list[RenderableType] = []
        for label, value in pairs[i : i + 2]:
            row += [label, Text(value)]
        short.add_row(*row)
    body: list[RenderableType] = [grid, short]
    env = environment_line(report.environment)
    if env:
        body.append(Text(env, style="dim"))
    return Panel(
        Group(*body),
        title=Text(f"{TOOL_NAME} {__version__}", style="bold"),
        title_align="left",
        box=box.ROUNDED,
    )


def components_table(report: Report) -> Table:
    """A pipeline's components: each one's class, dtype, devices and size, the odd dtype out marked."""
    rows = component_rows(report.target)
    dtypes = [r[2] for r in rows]
    table = Table(box=box.SIMPLE_HEAD, title="pipeline components", title_justify="left", title_style="bold", pad_edge=False)
    for column in ("component", "class", "dtype", "device", "parameters"):
        table.add_column(column, justify="right" if column == "parameters" else "left", no_wrap=column != "class")
    for name, cls, dtype, devices, params in rows:
        odd = len(set(dtypes)) > 1 and dtypes.count(dtype) < max(dtypes.count(d) for d in dtypes)
        table.add_row(name, cls, Text(dtype, style="bold yellow" if odd else ""), devices, params)
    return table


def _tensor_rows(f: Finding) -> Table:
    """`role  name dtype@device[shape]`, the role left out where it is the name (a module's `weight`)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    for t in f.tensors:
        name = tensor_name(t, relative_to=f.module)
        grid.add_row(
            "" if name == t.role else t.role,
            Text.assemble(
                (name, "bold"), " ", (t.dtype, dtype_style(t.dtype)), f"@{t.device}", (shape_label(t.shape), "dim")
            ),
        )
    return grid


def findings_table(findings: tuple[Finding, ...]) -> Table:
    # Two columns, not seven: the module path, op and tensors get the whole line, which
    # keeps a 40-character module name on one line at 80 columns.
    table = Table(box=box.SIMPLE_HEAD, show_lines=True, show_edge=False, expand=True, pad_edge=False)
    table.add_column("code", no_wrap=True)
    table.add_column("finding", overflow="fold")
    for f in findings:
        code = Text.assemble((f.code, "bold"), "\n", (f.severity, SEVERITY_STYLE[f.severity]))
        where = Text(module_label(f.module), style="bold")
        if f.module_type:
            where.append(f" {f.module_type}", style="dim")
        facts = Text()
        for label, value in (("op", f.op), ("stage", f.stage), ("source", source_label(f.source))):
            if value:
                if facts:
                    facts.append(" · ", style="dim")
                facts.append(f"{label} ", style="dim")
                facts.append(value, style="magenta" if label == "stage" else "")
        parts: list[RenderableType] = [where, Text(f.message), facts]
        if f.tensors:
            parts.append(_tensor_rows(f))
        if f.pytorch_error:
            parts.append(Text(f"pytorch: {f.pytorch_error}", style="dim italic"))
        for fix in f.fixes:
            parts.append(
                Text.assemble(
                    ("fix ", "bold green"),
                    (fix.strategy, "bold"),
                    (f" ({fix.applicability})", APPLICABILITY_STYLE.get(fix.applicability, "")),
                    ": ",
                    fix.description,
                )
            )
        table.add_row(code, Group(*parts))
    return table


# Below this many columns for a lineage step's detail, the detail goes on its own line
# under the step, so identifiers like `Model.forward(pixel_values=…)` are not cut mid-word.
LINEAGE_DETAIL_MIN = 48


def lineage_view(lineage: Mapping[str, Any], blamed: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None) -> RenderableType:
    """Per input, one line per stage: `stage  dtype@device[shape]  detail`, the stage that
    changed the dtype or device marked and highlighted, the stage a finding blames named."""
    blamed = blamed or {}
    return _LineageView(
        {name: [_lineage_cells(row) for row in lineage_rows(steps, blamed.get(name))] for name, steps in lineage.items()}
    )


class _LineageView:
    def __init__(self, tables: Mapping[str, list[list[Text]]]) -> None:
        self.tables = tables

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        tables = self.tables
        # The same column widths for every input, so the stages line up down the page.
        widths = [max((c[i].cell_len for rows in tables.values() for c in rows), default=1) for i in range(3)]
        stacked = options.max_width - (1 + sum(widths) + len(widths)) < LINEAGE_DETAIL_MIN
        yield Text.assemble(("lineage", "bold"), (f"  {CHANGED_MARK} the stage that changed the dtype or device", "dim"))
        for name, rows in tables.items():
            grid = Table.grid(padding=(0, 1))
            for width in widths[: 2 if stacked else 3]:
                grid.add_column(no_wrap=True, min_width=width)
            grid.add_column(overflow="fold")
            for mark, stage, meta, detail in rows:
                if stacked:
                    grid.add_row(mark, stage, meta)
                    if detail:
                        grid.add_row("", "", detail)
                else:
                    grid.add_row(mark, stage, meta, detail)
            yield Text(name, style="bold")
            yield Padding(grid, (0, 0, 0, 1))


def _lineage_cells(row: LineageRow) -> list[Text]:
    step = row.step
    changed = row.dtype_changed or row.device_changed
    meta = Text(step.dtype or UNKNOWN, style=dtype_style(step.dtype) + (" bold reverse" if row.dtype_changed else ""))
    if step.dtype is not None:  # a stage that knows no dtype (python values) shows no shape either
        meta.append_tokens(
            [
                # Stored stages (Arrow columns, per-row values) have no device and no batch shape yet.
                ("@" if step.device else "", "dim"),
                (step.device or "", "bold reverse" if row.device_changed else ""),
                (shape_label(step.shape) if step.shape is not None else "", "dim"),
            ]
        )
    return [
        Text(CHANGED_MARK if changed else " ", style="bold yellow"),
        Text(step.stage, style="bold" if changed else ""),
        meta,
        Text(row.detail_text(), style="bold red" if row.blamed_by else "" if changed else "dim"),
    ]


def module_tree(tree: DtypeTree) -> RenderableType:
    title = Text.assemble(
        ("parameter dtypes ", "bold"),
        (f"{tree.off_majority} of {plural(tree.params, 'parameter')} not ", "dim"),
        (tree.majority, dtype_style(tree.majority)),
    )
    root = Tree(Text(tree.root.module_type or "model", style="bold"))
    _, shown = _add_children(root, tree.root.children, TREE_LEAVES)
    hidden = tree.root.leaves() - shown
    if hidden > 0:
        root.add(Text(f"… {plural(hidden, 'more module')} not shown", style="dim"))
    return Group(title, Padding(root, (0, 0, 0, 1)))


def _node_label(node: DtypeNode) -> Text:
    label = Text(node.label or "model", style="bold")
    if node.module_type:
        label.append(f" {node.module_type}", style="dim")
    if node.collapsed:
        label.append("  ")
        for i, d in enumerate(node.dtypes):
            label.append(("/" if i else "") + d, style=dtype_style(d))
        if node.merged > 1:
            label.append(f" ×{node.merged}", style="dim")
        elif node.module_type != "Parameter":
            label.append(f" · {plural(node.params, 'param')}", style="dim")
        if node.kept_fp32:
            label.append(" · kept fp32 by the model", style="green")
    return label


def _add_children(parent: Tree, children: tuple[DtypeNode, ...], budget: int) -> tuple[int, int]:
    """Adds children until `budget` leaf lines are shown; returns (leaf lines, modules) shown."""
    lines = modules = 0
    for child in children:
        if lines >= budget:
            break
        branch = parent.add(_node_label(child))
        if child.children:
            more_lines, more_modules = _add_children(branch, child.children, budget - lines)
        else:
            more_lines, more_modules = 1, child.merged
        lines += more_lines
        modules += more_modules
    return lines, modules


def fix_panel(fix: FixOutcome) -> Panel:
    steps = Table.grid(padding=(0, 1))
    steps.add_column(no_wrap=True)
    steps.add_column(overflow="fold")
    for s in fix_steps(fix):
        style = FIX_STATUS_STYLE.get(s.status, "")
        steps.add_row(
            Text(s.mark, style=style),
            Text.assemble((s.strategy, "bold"), " ", (s.status, style), f": {s.detail}" if s.detail else ""),
        )
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    for label, value in fix_fields(fix):
        style = ("green" if fix.verified else "red") if label == "verified" else ""
        fields.add_row(label, Text(value, style=style))
    strategy = fix.strategy
    return Panel(
        Group(steps, fields),
        title=Text(f"fix: {strategy}" if strategy else "fix", style="bold"),
        title_align="left",
    )


def stand_ins_table(report: Report) -> Table:
    """The values a simulated step read from tensors without data, and what it took instead."""
    assert report.trace is not None
    table = Table(title=Text("stand-in values (simulated tensors hold none)", style="bold"), title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("where", no_wrap=True)
    table.add_column("read")
    table.add_column("taken as")
    table.add_column("why", style="dim", overflow="fold")
    for s in report.trace.stand_ins:
        table.add_row(Text(source_label(s.source) or UNKNOWN), Text(s.what), Text(s.value), Text(s.why))
    return table


def writes_table(report: Report) -> Table:
    """The files a simulated run wrote into scratch instead of over the user's."""
    assert report.trace is not None and report.trace.writes
    table = Table(title=Text("writes held back (the simulation left your files as they were)", style="bold"),
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("where", no_wrap=True)
    table.add_column("file")
    table.add_column("bytes", justify="right")
    for w in report.trace.writes:
        table.add_row(Text(source_label(w.source) or UNKNOWN), Text(w.path), Text(str(w.bytes)))
    return table


def summary(report: Report) -> Text:
    """The last line: the counts, or for `fix` the outcome, which is what a reader acts on."""
    s = report.summary
    if report.fix is not None:
        return fix_outcome_line(report)
    failure = report.trace.failure if report.trace else None
    if not report.findings:
        if failure is not None:
            return Text.assemble((NO_PROBLEMS_BUT_STOPPED, "bold yellow"), (f" · {traced_line(s)}{values_note(report)}{_held(report)}", "dim"))
        partial = partial_trace(report)
        if partial is not None:  # a partial trace is never a bare "no problems found"
            return Text.assemble((partial, "bold yellow"), (f" · {traced_line(s)}{values_note(report)}{_held(report)}", "dim"))
        return Text.assemble(("✓ ", "bold green"), (NO_PROBLEMS, "bold green"), (f" · {traced_line(s)}{values_note(report)}{_held(report)}", "dim"))
    worst = next((sev for sev in ("error", "warning", "info") if s.get(sev)), "info")
    return Text.assemble((counts_line(s), SEVERITY_STYLE[worst]), (f" · {traced_line(s)}{values_note(report)}{_held(report)}", "dim"))


def _held(report: Report) -> str:
    from dtype_doctor.report.suppress import counted

    text = counted(report.suppressed)
    return f" · {text}" if text else ""



def fix_outcome_line(report: Report) -> Text:
    assert report.fix is not None
    verified, outcome, before = fix_outcome(report.fix, report.summary)
    head = ("✓ ", "bold green") if verified else ("✗ ", "bold red")
    return Text.assemble(head, (outcome, "bold green" if verified else "bold red"), (f" ({before})", "dim"))
