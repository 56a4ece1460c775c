"""Help and usage text as the README and SPEC write it: `MODEL DATASET`, not `{MODEL}`."""

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


class Command(TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [_REQUIRED.sub(r"\1", piece) for piece in super().collect_usage_pieces(ctx)]
        return [_USAGE_AS_WRITTEN.get(p, p) for p in pieces]

    def get_help(self, ctx: Any) -> str:
        text = super().get_help(ctx)
        return _ARGUMENT_TYPE.sub(lambda m: m.group(1) + " " * len(m.group(2)), text)
