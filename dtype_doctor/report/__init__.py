"""The report stage: one Report, six output formats behind one function.

    text = render(report, "sarif")                 # what goes to stdout or --output
    print_report(report, "rich", console)          # straight to a terminal console

Each format is a module beside this one with `render(report, options) -> str` and its name in
`FORMAT`; adding a format is adding its module (and its test): modules are discovered. Formats import lazily, so `--format json`
never imports rich, and nothing here imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Iterable

from dtype_doctor.records.errors import UsageError
from dtype_doctor.report.common import FAIL_ON, RenderOptions

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console, RenderableType

    from dtype_doctor.records import Report

__all__ = [
    "FORMATS",
    "DEFAULT_WIDTH",
    "RenderOptions",
    "render",
    "print_report",
    "rules_table",
    "rules_markdown",
    "rule_doc",
    "render_renderable",
]

def _discover() -> dict[str, str]:
    """Format name → module: every module here with a top-level `render(report, options)`,
    named by its `FORMAT = "..."` (else its file name). Read from the source, not imported,
    so that choosing one format never imports the others (json never imports rich)."""
    import ast
    from pathlib import Path

    found: dict[str, str] = {}
    for path in sorted(Path(__file__).parent.glob("[!_]*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef) and n.name == "render" for n in tree.body):
            continue
        name = next(
            (n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
             and any(isinstance(t, ast.Name) and t.id == "FORMAT" for t in n.targets)),
            path.stem,
        )
        found[name] = f"{__name__}.{path.stem}"
    # rich first: the default on a terminal.
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "rich", kv[0])))


# Adding a format is adding its module (with `render` and `FORMAT`) and its test.
_FORMATS = _discover()
FORMATS = tuple(_FORMATS)
DEFAULT_WIDTH = 100  # rich text written to a file or pipe, where no terminal says how wide


def _check_fail_on(fail_on: str) -> None:
    if fail_on not in FAIL_ON:
        raise UsageError(f"unknown --fail-on {fail_on!r}; choose one of: {', '.join(FAIL_ON)}")


def _options(width: int | None, color: bool, fail_on: str, rules: Iterable[Any] | None, plot: str | None = None) -> RenderOptions:
    _check_fail_on(fail_on)
    return RenderOptions(width=width or DEFAULT_WIDTH, color=color, fail_on=fail_on, rules=tuple(rules or ()), plot=plot)


def _format_module(fmt: str) -> Any:
    if fmt not in _FORMATS:
        raise UsageError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return importlib.import_module(_FORMATS[fmt])


def render(
    report: Report,
    fmt: str,
    *,
    width: int | None = None,
    color: bool = False,
    fail_on: str = "error",
    rules: Iterable[Any] | None = None,
    plot: str | None = None,
) -> str:
    """The report as text in format `fmt`, ending in a newline.

    width and color matter to `rich` only (default 100 columns, no escape codes); fail_on
    decides which findings are JUnit failures; rules (the catalogue) lets SARIF describe
    each rule in its own words; plot (the --plot picture, as the output should link it) is
    embedded by markdown.
    """
    module = _format_module(fmt)
    return module.render(report, _options(width, color, fail_on, rules, plot))


def print_report(
    report: Report,
    fmt: str,
    console: Console,
    *,
    fail_on: str = "error",
    rules: Iterable[Any] | None = None,
) -> None:
    """Writes the report to `console`: rich at the console's own width and colours, the
    machine formats as plain text with no wrapping or highlighting."""
    module = _format_module(fmt)
    if fmt == "rich":
        _check_fail_on(fail_on)
        console.print(module.report_renderable(report))
        return
    console.out(module.render(report, _options(None, False, fail_on, rules)), end="", highlight=False)


def rules_table(rules: Iterable[Any]) -> RenderableType:
    from dtype_doctor.report.rule_docs import rules_table as table

    return table(rules)


def rules_markdown(rules: Iterable[Any]) -> str:
    from dtype_doctor.report.rule_docs import rules_markdown as table

    return table(rules)


def rule_doc(rule: Any) -> RenderableType:
    from dtype_doctor.report.rule_docs import rule_doc as doc

    return doc(rule)


def render_renderable(renderable: RenderableType, *, width: int | None = None, color: bool = False) -> str:
    """Any rich renderable (a rules table, a rule page) as text, like `render` does for reports."""
    from dtype_doctor.report.console import render_text

    return render_text(renderable, width=width or DEFAULT_WIDTH, color=color)
