"""A picture of the value ranges: each module's peak |x| and smallest non-zero |x| on a log scale,
against what float16 and bfloat16 can hold.

The trace measures every module's outputs (`ModuleCall.stats`); a finding quotes one number
(DD301's peak), this shows them all: how far each layer sits from fp16's 65504 and from its
smallest normal 6.1e-5 (below it values lose precision as subnormals, below 6e-8 they are 0).

    module_ranges(trace)         the data: one ModuleRange per leaf module that ran
    range_strip(report)          a rich renderable for the terminal report
    write_plot(report, path)     an SVG or PNG with matplotlib (the `plot` extra)

Nothing here imports torch; matplotlib only when a file is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dtype_doctor.records.errors import UsageError
from dtype_doctor.records import FP16_MAX, FP16_TINY, Report, Trace

FP16_SUBNORMAL = 2.0**-24  # 5.96e-08, the smallest positive float16
BF16_MAX = 3.3895313892515355e38
BF16_TINY = 2.0**-126  # 1.18e-38, bfloat16's smallest normal (float32's exponent range)
# (value, label) of each limit the picture draws, fp16's first.
LIMITS = (
    (FP16_SUBNORMAL, "fp16 smallest subnormal 6e-8"),
    (FP16_TINY, "fp16 smallest normal 6.1e-5"),
    (FP16_MAX, "fp16 max 65504"),
    (BF16_TINY, "bf16 smallest normal 1.2e-38"),
    (BF16_MAX, "bf16 max 3.4e38"),
)
PLOT_SUFFIXES = (".svg", ".png")
STRIP_ROWS = 12  # modules the terminal strip lists before "… N more within fp16's range"


@dataclass(frozen=True, slots=True)
class ModuleRange:
    name: str
    module_type: str
    peak: float  # largest |x| of its floating outputs (inf/nan when they held them)
    smallest: float | None  # smallest non-zero |x| seen in the sampled values

    @property
    def beyond_fp16(self) -> bool:
        return not math.isfinite(self.peak) or self.peak > FP16_MAX

    @property
    def below_fp16_normal(self) -> bool:
        return self.smallest is not None and self.smallest < FP16_TINY

    @property
    def verdict(self) -> str:
        if not math.isfinite(self.peak):
            return "inf/nan"
        if self.peak > FP16_MAX:
            return "over fp16"
        if self.smallest is not None and self.smallest < FP16_SUBNORMAL:
            return "under fp16"
        if self.below_fp16_normal:
            return "subnormal"
        return ""


def module_ranges(trace: Trace | None) -> list[ModuleRange]:
    """Each leaf module that ran, in the order it first ran, with its outputs' extremes over its calls."""
    if trace is None or not trace.values_measured:
        return []
    # A module with children is a container: its outputs are its last child's, shown there.
    parents = {".".join(parts[:i]) for m in trace.modules if m.name for parts in [m.name.split(".")] for i in range(len(parts))}
    ranges: dict[str, list[Any]] = {}
    for call in trace.modules:
        if call.stats is None or call.name in parents:
            continue
        entry = ranges.setdefault(call.name, [call.module_type, 0.0, None])
        peak = call.stats.absmax
        if not math.isfinite(peak):
            entry[1] = peak  # inf or nan: what the picture must show, whatever else was seen
        elif math.isfinite(entry[1]):
            entry[1] = max(entry[1], peak)
        low = call.stats.min_nonzero
        if low is not None and low > 0:
            entry[2] = low if entry[2] is None else min(entry[2], low)
    return [ModuleRange(n, t, p, s) for n, (t, p, s) in ranges.items() if p != 0 or s is not None]


# ----------------------------------------------------------------------------- terminal


def range_strip(report: Report, *, rows: int = STRIP_ROWS) -> Any | None:
    """The terminal's picture: one bar per module from its smallest to its peak |x|, fp16's limits
    marked; the modules nearest a limit first. None when no values were measured."""
    ranges = module_ranges(report.trace)
    if not ranges:
        return None
    return _Strip(ranges, rows)


class _Strip:
    def __init__(self, ranges: list[ModuleRange], rows: int) -> None:
        self.ranges, self.rows = ranges, rows

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        shown = _nearest_limits(self.ranges, self.rows)
        width = options.max_width
        label_width = min(max(len(r.name) for r in shown), max(12, width // 3))
        tail = 21  # " 5.8e+05 under fp16"
        bar_width = max(10, width - label_width - tail - 2)
        lo, hi = _scale(shown)
        yield Text("value ranges: |x| of each module's outputs, log scale; fp16's limits ┆ 6e-8  │ 6.1e-5  ┃ 65504",
                   style="bold", overflow="fold")
        axis = _axis(lo, hi, bar_width)
        yield Text(" " * (label_width + 1) + axis, style="dim")
        for r in shown:
            name = r.name if len(r.name) <= label_width else "…" + r.name[-(label_width - 1):]
            line = Text(name.ljust(label_width) + " ", no_wrap=True, overflow="ellipsis")
            line.append_text(_bar(r, lo, hi, bar_width))
            peak = "inf/nan" if not math.isfinite(r.peak) else f"{r.peak:.1e}"
            style = "bold red" if r.beyond_fp16 else ("yellow" if r.below_fp16_normal else "dim")
            line.append(f" {peak:>8} {r.verdict}".rstrip(), style=style)
            yield line
        rest = len(self.ranges) - len(shown)
        over = sum(r.beyond_fp16 for r in self.ranges)
        note = f"{len(self.ranges)} modules measured; {over} beyond fp16's 65504" + (f"; {rest} more not shown" if rest else "")
        yield Text(note + " · bf16 holds 1.2e-38 … 3.4e38", style="dim")


def _nearest_limits(ranges: list[ModuleRange], rows: int) -> list[ModuleRange]:
    """The modules closest to (or past) fp16's limits, in model order."""
    def margin(r: ModuleRange) -> float:
        top = math.inf if not math.isfinite(r.peak) else math.log10(max(r.peak, 1e-45) / FP16_MAX)
        bottom = math.log10(FP16_TINY / r.smallest) if r.smallest else -math.inf
        return max(top, bottom)

    if len(ranges) <= rows:
        return ranges
    picked = set(sorted(range(len(ranges)), key=lambda i: -margin(ranges[i]))[:rows])
    return [r for i, r in enumerate(ranges) if i in picked]


def _scale(ranges: Iterable[ModuleRange]) -> tuple[float, float]:
    """log10 bounds covering the values and fp16's limits, a decade of margin each side."""
    values = [v for r in ranges for v in (r.peak, r.smallest) if v is not None and math.isfinite(v) and v > 0]
    lo = math.floor(math.log10(min([FP16_SUBNORMAL, *values]))) - 1
    hi = math.ceil(math.log10(max([FP16_MAX, *values]))) + 1
    return lo, hi


def _column(value: float, lo: float, hi: float, width: int) -> int:
    if not math.isfinite(value):
        return width - 1
    x = (math.log10(max(value, 10.0**lo)) - lo) / (hi - lo)
    return min(width - 1, max(0, round(x * (width - 1))))


def _axis(lo: float, hi: float, width: int) -> str:
    cells = [" "] * width
    step = max(1, round((hi - lo) / max(1, width // 9)))
    for e in range(int(lo), int(hi) + 1, step):
        label = f"1e{e}"
        c = _column(10.0**e, lo, hi, width)
        if c + len(label) <= width and all(ch == " " for ch in cells[c:c + len(label) + 1]):
            cells[c:c + len(label)] = label
    return "".join(cells).rstrip()


def _bar(r: ModuleRange, lo: float, hi: float, width: int) -> Any:
    from rich.text import Text

    cells = ["·"] * width
    marks = {_column(FP16_SUBNORMAL, lo, hi, width): "┆", _column(FP16_TINY, lo, hi, width): "│",
             _column(FP16_MAX, lo, hi, width): "┃"}
    for c, mark in marks.items():
        cells[c] = mark
    start = _column(r.smallest if r.smallest else r.peak, lo, hi, width)
    end = _column(r.peak, lo, hi, width)
    for c in range(start, end + 1):
        cells[c] = "━" if c not in marks else "╋"
    text = Text("".join(cells))
    fp16_max = _column(FP16_MAX, lo, hi, width)
    fp16_tiny = _column(FP16_TINY, lo, hi, width)
    text.stylize("dim", 0, width)
    text.stylize("green", start, end + 1)
    if end > fp16_max:
        text.stylize("bold red", max(start, fp16_max + 1), end + 1)
    if start < fp16_tiny:
        text.stylize("yellow", start, min(end + 1, fp16_tiny))
    return text


# ----------------------------------------------------------------------------- file


def check_plot_path(path: Path) -> None:
    """--plot FILE.svg|png: the suffix says the format; matplotlib must be there (before anything loads)."""
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: name an .svg or .png file")
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:  # found, not imported: that waits for the drawing
        raise UsageError("--plot needs matplotlib: pip install 'dtype-doctor[plot]'")


def plot_figure(report: Report) -> Any:
    """The matplotlib Figure: one horizontal bar per module, fp16's and bf16's limits as lines."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    ranges = module_ranges(report.trace)
    rows = max(len(ranges), 1)
    fig = Figure(figsize=(10, 1.6 + 0.22 * rows), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    finite = [v for r in ranges for v in (r.peak, r.smallest) if v is not None and math.isfinite(v) and v > 0]
    lo = min([FP16_SUBNORMAL, *finite]) / 10
    hi = max([FP16_MAX, *finite]) * 10
    for i, r in enumerate(ranges):
        y = rows - 1 - i
        peak = r.peak if math.isfinite(r.peak) else hi
        low = r.smallest if r.smallest else peak
        color = "#c0392b" if r.beyond_fp16 else ("#d4a017" if r.below_fp16_normal else "#2e86c1")
        ax.plot([low, peak], [y, y], color=color, linewidth=4, solid_capstyle="butt")
        ax.plot([peak], [y], marker="|", color=color, markersize=10)
    ax.axvspan(lo, FP16_SUBNORMAL, color="#c0392b", alpha=0.08, lw=0)
    ax.axvspan(FP16_SUBNORMAL, FP16_TINY, color="#d4a017", alpha=0.10, lw=0)
    ax.axvspan(FP16_MAX, hi, color="#c0392b", alpha=0.08, lw=0)
    for value, label in LIMITS:
        if lo <= value <= hi:
            ax.axvline(value, color="#555555", linestyle="--" if "bf16" in label else "-", linewidth=0.8)
            ax.text(value, rows - 0.4, f" {label}", rotation=90, va="top", ha="left", fontsize=7, color="#555555")
    off = [label for value, label in LIMITS if not lo <= value <= hi]
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.7, rows - 0.3)
    ax.set_yticks(range(rows))
    ax.set_yticklabels([r.name for r in reversed(ranges)] or ["(no values measured)"], fontsize=7)
    ax.set_xlabel("|x| of each module's outputs (smallest non-zero → peak), log scale"
                  + (f"\noff the scale: {', '.join(off)}" if off else ""), fontsize=8)
    ax.set_title(f"dtype-doctor value ranges · {report.target.model}", fontsize=10, loc="left")
    ax.grid(axis="x", which="major", alpha=0.2)
    return fig


def write_plot(report: Report, path: Path, *, quiet: bool = False) -> None:
    """The picture as an SVG or PNG at `path` (written through a temporary file, as every output)."""
    import io
    import sys

    from dtype_doctor.records.files import write_atomic

    if not module_ranges(report.trace):
        why = report.trace.values if report.trace is not None else "no trace"
        print(f"dtype-doctor: no plot written to {path}: no values were measured ({why})", file=sys.stderr)
        return
    import matplotlib

    fmt = Path(path).suffix.lower().lstrip(".")
    buffer = io.BytesIO()
    # Text stays text in an SVG (small, searchable), and its ids do not change from run to run.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dtype-doctor"}):
        fig = plot_figure(report)
        fig.savefig(buffer, format=fmt, dpi=120, metadata={"Date": None} if fmt == "svg" else {"Software": None})
    write_atomic(Path(path), buffer.getvalue(), what="the plot")
    if not quiet:
        print(f"plot written to {path}", file=sys.stderr)
