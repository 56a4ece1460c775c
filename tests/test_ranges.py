"""The picture of the value ranges, on a recorded trace: the data (leaf modules, extremes over
calls), the terminal strip, the file (rendered and opened as an image) and the markdown that
embeds it."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from dtype_doctor.records import ModelInfo, ModuleCall, Report, Target, Trace, ValueStats
from dtype_doctor.report import render
from dtype_doctor.report.ranges import FP16_SUBNORMAL, module_ranges, plot_figure, write_plot


def stats(absmax: float, smallest: float | None) -> ValueStats:
    return ValueStats(absmax, not math.isfinite(absmax), smallest, 0.0, 0.0, 0.0, 64, 64)


CALLS = (
    ("encoder", "Encoder", stats(70_000.0, 1e-3)),  # a container: its last child's output, not shown again
    ("encoder.layer.0.dense", "Linear", stats(12.0, 1e-3)),
    ("encoder.layer.0.act", "GELU", stats(9.0, 2e-9)),  # under fp16's smallest subnormal
    ("encoder.layer.1.dense", "Linear", stats(4.0, 3e-5)),  # fp16 subnormal
    ("encoder.layer.1.dense", "Linear", stats(70_000.0, 1e-2)),  # a second call: the extremes over both
    ("head", "Linear", stats(math.inf, 1e-1)),
)


def trace(values: str = "measured") -> Trace:
    modules = tuple(ModuleCall(n, t, (), (), stats=s) for n, t, s in CALLS)
    model = ModelInfo("Toy", (), module_types=tuple((n, t) for n, t, _ in CALLS))
    return Trace(ops=(), modules=modules, model=model, inputs=(), values=values)


def report(values: str = "measured") -> Report:
    return Report((), Target("toy-model", "toy-data", "train", "cpu", False, "float32", None, False), {}, trace(values))


def test_module_ranges_are_the_leaves_with_their_extremes() -> None:
    ranges = {r.name: r for r in module_ranges(trace())}
    assert list(ranges) == ["encoder.layer.0.dense", "encoder.layer.0.act", "encoder.layer.1.dense", "head"]
    dense1 = ranges["encoder.layer.1.dense"]
    assert (dense1.peak, dense1.smallest, dense1.verdict) == (70_000.0, 3e-5, "over fp16")
    assert ranges["encoder.layer.0.act"].verdict == "under fp16" and ranges["encoder.layer.0.act"].smallest < FP16_SUBNORMAL
    assert ranges["head"].verdict == "inf/nan" and ranges["encoder.layer.0.dense"].verdict == ""
    assert module_ranges(trace("not measured: fake tensors hold no values")) == []


def test_the_terminal_strip_marks_fp16s_limits() -> None:
    text = render(report(), "rich", width=100)
    block = text[text.index("value ranges"):]
    lines = block.splitlines()
    assert "65504" in lines[0] and "6.1e-5" in lines[0]
    rows = {line.split()[0]: line for line in lines if line.startswith(("encoder.", "head"))}
    assert set(rows) == {"encoder.layer.0.dense", "encoder.layer.0.act", "encoder.layer.1.dense", "head"}
    assert all(("┃" in r or "╋" in r) and ("│" in r or "╋" in r) for r in rows.values())  # the limits on every bar
    assert rows["encoder.layer.1.dense"].rstrip().endswith("over fp16") and rows["head"].rstrip().endswith("inf/nan")
    assert max(len(line) for line in text.splitlines()) <= 100
    narrow = render(report(), "rich", width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60
    # No values measured (a simulated trace): no strip.
    assert "value ranges" not in render(report("not measured: fake tensors hold no values"), "rich")


def test_the_strip_keeps_to_the_modules_nearest_a_limit() -> None:
    many = tuple((f"layer.{i}", "Linear", stats(1.0 + i, 1e-2)) for i in range(30)) + (("last", "Linear", stats(1e5, 1e-2)),)
    t = replace(trace(), modules=tuple(ModuleCall(n, ty, (), (), stats=s) for n, ty, s in many))
    r = replace(report(), trace=t)
    strip = render(r, "rich", width=100)
    assert "last" in strip and "31 modules measured; 1 beyond fp16's 65504; 19 more not shown" in strip


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_plot_file_is_an_image_of_every_module(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / f"ranges{suffix}"
    write_plot(report(), path)
    data = path.read_bytes()
    if suffix == ".png":
        from PIL import Image

        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            width, height = image.size
            assert width >= 800 and height >= 200
            colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
            assert colors is not None and len(colors) > 10  # drawn, not blank
    else:
        root = ET.fromstring(data)
        assert root.tag.endswith("svg")
        text = "".join(root.itertext())
        for name in ("encoder.layer.0.dense", "encoder.layer.1.dense", "head", "fp16 max 65504", "fp16 smallest normal"):
            assert name in text, name
        write_plot(report(), tmp_path / "again.svg")
        assert (tmp_path / "again.svg").read_bytes() == data  # the same picture of the same report, byte for byte


def test_the_figure_draws_fp16_and_bf16_limits() -> None:
    pytest.importorskip("matplotlib")
    fig = plot_figure(report())
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.texts]
    assert any("fp16 max 65504" in t for t in labels) and any("fp16 smallest subnormal" in t for t in labels)
    assert "bf16" in ax.get_xlabel()  # off this scale, said so


def test_no_values_no_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_plot(report("not measured: fake tensors hold no values"), tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists() and "no plot written" in capsys.readouterr().err


def test_markdown_embeds_the_plot_and_lists_the_modules_beyond_fp16() -> None:
    md = render(report(), "markdown", plot="out/value ranges.svg")
    assert "### Value ranges" in md and "](out/value%20ranges.svg)" in md
    assert "| `encoder.layer.1.dense` |" in md and "over fp16" in md
    assert "### Value ranges" not in render(report("not measured: fake tensors hold no values"), "markdown")
