"""Help and usage text as the README and docs/commands/ write it: `MODEL DATASET`, not `{MODEL}`; options
in panels (each option's `rich_help_panel`), in plain text that pastes into a shell; the exit
codes after the examples."""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperCommand

_REQUIRED = re.compile(r"\{([A-Z][A-Z0-9_.]*)\}")
# An argument's help line: `  MODEL <str>   Model directory ...`; the type label says nothing
# a metavar does not, so it is blanked (same width, so the help column stays aligned).
_ARGUMENT_TYPE = re.compile(r"^(  [A-Z][A-Z0-9_.]*)( <[\w\[\]]+>)", re.M)


# `fix` takes MODEL DATASET, or with --run the command after `--`: the usage line says so.
_USAGE_AS_WRITTEN = {"[MODEL]": "MODEL", "[DATASET]": "DATASET", "[COMMAND]...": "[-- COMMAND...]"}

EXIT_CODES = """
Exit codes:

\b
  0  nothing at or above --fail-on
  1  findings at or above --fail-on (fix: the fix did not verify)
  2  bad usage, or input that cannot be loaded (one line on stderr)
  3  dtype-doctor itself failed (--debug shows where)
"""


class Command(TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [_REQUIRED.sub(r"\1", piece) for piece in super().collect_usage_pieces(ctx)]
        return [_USAGE_AS_WRITTEN.get(p, p) for p in pieces]

    def get_help(self, ctx: Any) -> str:
        text = super().get_help(ctx)
        return _ARGUMENT_TYPE.sub(lambda m: m.group(1) + " " * len(m.group(2)), text)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Arguments, then the options without a panel (--help), then one section per panel in
        the order its first option comes."""
        args: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        general = panels.pop("Options", [])
        for title, records in panels.items():
            with formatter.section(f"{title} options"):
                formatter.write_dl(records)
        if general:
            with formatter.section("Options"):
                formatter.write_dl(general)
