"""`dtype-doctor rule CODE` and `dtype-doctor rules`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def rule_command(
    code: Annotated[str, typer.Argument(metavar="CODE", help="A rule code (DD101) or name (dtype-mismatch-in-op).", show_default=False)],
    format: Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", help="rich or json.")] = None,
) -> None:
    """Explain one rule: what it flags, why it matters, an example, the fix."""
    from dtype_doctor.cli import checks
    from dtype_doctor.rules import get_rule

    checks.rule(code)
    rule = get_rule(code)
    if format == "json":
        _print_json(_rule_dict(rule))
        return
    _check_format(format)
    from dtype_doctor.report import rule_doc

    _print(rule_doc(rule))


def rules_command(
    format: Annotated[Optional[str], typer.Option("--format", "-f", metavar="FORMAT", help="rich, json or markdown (the README's table).")] = None,
) -> None:
    """List every rule with its code, name, default severity and summary."""
    from dtype_doctor.rules import all_rules

    if format == "json":
        _print_json([_rule_dict(r) for r in all_rules()])
        return
    if format == "markdown":
        import sys

        from dtype_doctor.report import rules_markdown

        sys.stdout.write(rules_markdown(all_rules()))
        return
    _check_format(format)
    from dtype_doctor.report import rules_table

    _print(rules_table(all_rules()))


def _check_format(fmt: str | None) -> None:
    if fmt not in (None, "rich"):
        from dtype_doctor.cli import checks

        checks.formats(fmt, ("rich", "json", "markdown"), " for rule pages")


def _rule_dict(rule: object) -> dict:
    keys = ("code", "name", "severity", "summary", "why", "example", "fix", "fix_safety", "references", "device_note")
    return {k: (list(v) if isinstance(v := getattr(rule, k), tuple) else v) for k in keys}


def _print_json(obj: object) -> None:
    import json
    import sys

    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _print(renderable: object) -> None:
    import sys

    from dtype_doctor.cli.output import text_width
    from dtype_doctor.report import render_renderable

    sys.stdout.write(render_renderable(renderable, width=text_width(), color=sys.stdout.isatty()))
