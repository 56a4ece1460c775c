"""`--config PATH`: options from a TOML file, as click's default_map; the command line wins.

    [tool.dtype-doctor]          # in pyproject.toml (read from the working directory by default)
    batch-size = 4               # or in any TOML file given with --config, at its top level
    fail-on = "warning"
    ignore = ["DD108"]           # a list for the comma-separated options

    [tool.dtype-doctor.scan]     # a table per command overrides the shared keys for it
    dtype = "float16"

A shared key applies to every command that has the option; a key no command has is an
error (exit 2), so a typo never passes silently. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtype_doctor.errors import UsageError

PYPROJECT = "pyproject.toml"
COMMANDS = ("scan", "fix", "compare", "run")


def config_path(args: list[str]) -> tuple[Path | None, bool]:
    """The file named by --config before any `--` (after it, the arguments are a script's),
    else pyproject.toml in the working directory; and whether it was named explicitly."""
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--config":
            if i + 1 >= len(args):
                raise UsageError("--config needs a PATH")
            return Path(args[i + 1]), True
        if a.startswith("--config="):
            return Path(a.split("=", 1)[1]), True
    default = Path(PYPROJECT)
    return (default, False) if default.is_file() else (None, False)


def default_map(args: list[str], options: dict[str, set[str]]) -> dict[str, dict[str, Any]] | None:
    """click's default_map for `options` (command → its option names) from the config file."""
    import tomllib

    path, explicit = config_path(args)
    if path is None:
        return None
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("dtype-doctor")
    if table is None:
        if path.name == PYPROJECT or not explicit:
            return None  # a pyproject.toml without our table configures nothing
        table = data
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.dtype-doctor] must be a table")
    shared = {k: v for k, v in table.items() if not isinstance(v, dict)}
    per_command = {k: v for k, v in table.items() if isinstance(v, dict)}
    unknown_tables = sorted(set(per_command) - set(COMMANDS))
    if unknown_tables:
        raise UsageError(f"{path}: unknown command table [{unknown_tables[0]}]; known: {', '.join(COMMANDS)}")
    every = set().union(*options.values()) if options else set()
    out: dict[str, dict[str, Any]] = {}
    for key, value in shared.items():
        name = _name(key)
        if name not in every:
            raise UsageError(f"{path}: unknown option {key!r}")
        for command, names in options.items():
            if name in names:
                out.setdefault(command, {})[name] = _value(value)
    for command, values in per_command.items():
        for key, value in values.items():
            name = _name(key)
            if name not in options.get(command, set()):
                raise UsageError(f"{path}: {command} has no option {key!r}")
            out.setdefault(command, {})[name] = _value(value)
    return out


def _name(key: str) -> str:
    return key.removeprefix("--").replace("-", "_")


def _value(value: Any) -> Any:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)  # --select / --ignore take comma-separated codes
    return value
