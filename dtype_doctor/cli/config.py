"""`--config PATH`: options from a TOML file, as click's default_map; the command line wins.

    [tool.dtype-doctor]          # in pyproject.toml (read from the working directory by default)
    batch-size = 4               # or in any TOML file given with --config, at its top level
    fail-on = "warning"
    ignore = ["DD108"]           # a list for the comma-separated options

    [tool.dtype-doctor.scan]     # a table per command overrides the shared keys for it
    dtype = "float16"

The pipeline itself can be named too, so a bare `dtype-doctor scan` (or `run`) checks it:

    model = "models/classifier"  # MODEL of scan, fix and compare
    dataset = "data/train.parquet"   # DATASET of scan, fix and compare
    preprocess = "prep.py:tokenize"
    script = "train.py --epochs 1"   # run's command: `python train.py --epochs 1` (or "torchrun ...")

A shared key applies to every command that has the option; a key no command has is an
error (exit 2), so a typo never passes silently. Paths are read from the working directory,
as on the command line. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


PYPROJECT = "pyproject.toml"
COMMANDS = ("scan", "fix", "compare", "run")
# Arguments a key may give: MODEL and DATASET, and run's COMMAND as the `script` key.
KEYED_ARGUMENTS = ("model", "dataset", "command")
_KEY_NAMES = {"script": "command"}  # `script` names run's COMMAND; fix's --script stays an option of fix alone
_LAUNCHERS = ("python", "python3", "accelerate", "torchrun")


def _refused(message: str) -> Exception:
    """A UsageError, imported only when one is raised: records.errors imports every record module, which
    `--help` (reading pyproject.toml's table) need not pay for."""
    from dtype_doctor.records.errors import UsageError

    return UsageError(message)


def config_path(args: list[str]) -> tuple[Path | None, bool]:
    """The file named by --config before any `--` (after it, the arguments are a script's),
    else pyproject.toml in the working directory; and whether it was named explicitly."""
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--config":
            if i + 1 >= len(args):
                raise _refused("--config needs a PATH")
            return Path(args[i + 1]), True
        if a.startswith("--config="):
            return Path(a.split("=", 1)[1]), True
    default = Path(PYPROJECT)
    return (default, False) if default.is_file() else (None, False)


def default_map(args: list[str], parameters: Callable[[], dict[str, dict[str, str]]]) -> dict[str, dict[str, Any]] | None:
    """click's default_map from the config file, for the commands' parameters that `parameters()`
    gives (command → {parameter name: option|multiple|argument}), asked only when a table applies:
    loading every command's options costs what a run without a config need not pay."""
    import tomllib

    path, explicit = config_path(args)
    if path is None:
        return None
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise _refused(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _refused(f"--config {path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise _refused(f"{path} is not valid TOML: {exc}") from None
    table = data.get("tool", {}).get("dtype-doctor")
    if table is None:
        if path.name == PYPROJECT or not explicit:
            return None  # a pyproject.toml without our table configures nothing
        table = data
    if not isinstance(table, dict):
        raise _refused(f"{path}: [tool.dtype-doctor] must be a table")
    params = parameters()
    shared = {k: v for k, v in table.items() if not isinstance(v, dict)}
    per_command = {k: v for k, v in table.items() if isinstance(v, dict)}
    unknown_tables = sorted(set(per_command) - set(COMMANDS))
    if unknown_tables:
        raise _refused(f"{path}: unknown command table [{unknown_tables[0]}]; known: {', '.join(COMMANDS)}")
    every = set().union(*(p.keys() for p in params.values())) if params else set()
    out: dict[str, dict[str, Any]] = {}
    for key, value in shared.items():
        name = _name(key, shared=True)
        if name not in every:
            raise _refused(f"{path}: unknown option {key!r}{_near(key, every)}")
        for command, kinds in params.items():
            if name in kinds:
                out.setdefault(command, {})[name] = _value(value, kinds[name], name, path)
    for command, values in per_command.items():
        kinds = params.get(command, {})
        for key, value in values.items():
            name = _name(key, shared=command == "run")
            if name not in kinds:
                raise _refused(f"{path}: {command} has no option {key!r}")
            out.setdefault(command, {})[name] = _value(value, kinds[name], name, path)
    return out


def _name(key: str, *, shared: bool) -> str:
    name = key.removeprefix("--").replace("-", "_")
    return _KEY_NAMES.get(name, name) if shared else name


def _near(key: str, names: set[str]) -> str:
    from dtype_doctor.cli.checks import did_you_mean

    shown = {n.replace("_", "-") for n in names if n != "command"} | {"script"}
    return did_you_mean(key, sorted(shown))


def _value(value: Any, kind: str, name: str, path: Path) -> Any:
    if kind == "multiple":
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if kind == "argument" and name == "command":  # the `script` key
        import shlex

        if not isinstance(value, (str, list)) or not value:
            raise _refused(f"{path}: script must be a command line, e.g. \"train.py --epochs 1\"")
        words = shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
        return words if words[0] in _LAUNCHERS or words[0] == "-m" else ["python", *words]
    if isinstance(value, list):
        return ",".join(str(v) for v in value)  # --select / --ignore take comma-separated codes
    return value
