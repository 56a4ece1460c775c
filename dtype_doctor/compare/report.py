"""The comparison as text: `rich` (the scan report's header, one table, each row's details,
the recommendation) or `json` (Comparison.to_dict()). No torch import."""

from __future__ import annotations

import json
import math

from dtype_doctor.compare.records import Comparison, Row
from dtype_doctor.records.errors import UsageError
from dtype_doctor.report.common import byte_size, json_default, module_label

FORMATS = ("rich", "json")
SHOWN_MODULES = 3  # overflowing modules named before "… N more"
VERDICT_STYLE = {"reference": "cyan", "ok": "green"}


def render(comparison: Comparison, fmt: str, *, width: int = 100, color: bool = False) -> str:
    if fmt == "json":
        return json.dumps(comparison.to_dict(), indent=2, default=json_default) + "\n"
    if fmt == "rich":
        from dtype_doctor.report.console import render_text

        return render_text(renderable(comparison), width=width, color=color)
    raise UsageError(f"unknown format {fmt!r} for compare; choose one of: {', '.join(FORMATS)}")


def renderable(comparison: Comparison):  # noqa: ANN201 - a rich renderable; rich imports lazily
    from rich.console import Group
    from rich.text import Text

    from dtype_doctor.records import Report
    from dtype_doctor.report.console import Printable, header

    parts = [header(Report((), comparison.target, comparison.environment)), Text(), Text(_method(comparison), style="dim")]
    parts += [_table(comparison), _details(comparison)]
    rec = comparison.recommendation
    parts += [Text(), Text.assemble((rec.question, "bold"), " ", rec.line)]
    return Printable(Group(*parts))


def _method(c: Comparison) -> str:
    gpu = f" on {c.gpu_name}" if c.gpu_name else ""
    return f"{c.output} vs fp32 · {c.measures} time{gpu}: median of {c.repeat} · peak: weights + inputs + {c.peak_method}"


def _table(c: Comparison):  # noqa: ANN202
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=True)
    table.add_column("row", no_wrap=True, style="bold")
    for name in ("weights", "peak", "time", "max abs", "max rel", "cosine"):
        table.add_column(name, justify="right", no_wrap=True)
    # Whether the GradScaler step works is part of the verdict ("ok" includes it); details say why not.
    table.add_column("verdict", ratio=1)
    for r in c.rows:
        out = r.output
        table.add_row(
            r.variant.label,
            byte_size(r.weight_bytes),
            byte_size(r.peak_bytes) if r.peak_bytes is not None else "—",
            _seconds(r.time_s),
            _error(out.max_abs) if out else "—",
            _error(out.max_rel) if out else "—",
            (f"{out.cosine:.6f}" if out.finite else "nan") if out else "—",
            Text(r.verdict, style=VERDICT_STYLE.get(r.verdict, "yellow" if not r.failure else "red")),
        )
    return table


def _details(c: Comparison):  # noqa: ANN202
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    for r in c.rows:
        lines = _detail_lines(r)
        for i, (key, value) in enumerate(lines):
            grid.add_row(r.variant.label if i == 0 else "", key, Text(value))
    return Group(Text(), grid) if grid.row_count else Group()


def _detail_lines(r: Row) -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    if r.failure:
        lines.append(("fails", r.failure))
    if r.fp32_modules:
        lines.append(("fp32 set", ", ".join(r.fp32_modules)))
    if r.note:
        lines.append(("note", r.note))
    op = r.worst_op
    if op is not None:
        own = f", of which its own rounding {_error(op.own_rel_error)}" if op.own_rel_error is not None else ""
        lines.append(("worst op", f"{op.op} in {module_label(op.module)}: rel error {_error(op.rel_error)}{own}"))
    if r.overflowing:
        shown = ", ".join(module_label(m) for m in r.overflowing[:SHOWN_MODULES])
        more = f" … {len(r.overflowing) - SHOWN_MODULES} more" if len(r.overflowing) > SHOWN_MODULES else ""
        lines.append(("overflow", f"{len(r.overflowing)} module(s) inf/NaN where fp32 is finite, first {shown}{more}"))
    step = r.train_step
    if step is not None and (not step.ok or step.cuda):
        lines.append(("train", "; ".join(x for x in (step.error or step.detail, step.cuda) if x)))
    return lines


def _error(x: float | None) -> str:
    if x is None:
        return "—"
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return "0" if x == 0 else f"{x:.1e}"


def _seconds(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"
