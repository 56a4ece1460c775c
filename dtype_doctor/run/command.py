"""What the user asked to run: `python FILE ARGS…` or `python -m MODULE ARGS…`, as a record."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dtype_doctor.records.errors import InputError, UsageError

# `python`, `python3`, `python3.12`, `/usr/bin/python3`, `.venv/bin/python`.
_PYTHON = re.compile(r"(^|[/\\])python(\d+(\.\d+)?)?(\.exe)?$")
# Interpreter flags that change nothing the doctor needs to reproduce (unbuffered, no site-packages cache...).
_HARMLESS_FLAGS = ("-u", "-B", "-W", "-X", "-O", "-OO")


@dataclass(frozen=True)
class ScriptCommand:
    """A script to run in-process: a file path or a module name, and the arguments it is given."""

    kind: str  # file | module
    target: str  # the file's absolute path, or the module's dotted name
    args: tuple[str, ...]
    argv0: str = ""  # the file as the user wrote it: python puts that in sys.argv[0]

    @property
    def display(self) -> str:
        """The script as the user would name it in a report ("train.py", "-m pkg.train")."""
        if self.kind == "module":
            return f"-m {self.target}"
        path = Path(self.target)
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)


def parse_command(argv: list[str] | tuple[str, ...]) -> ScriptCommand:
    """`['python', 'train.py', '--epochs', '3']` → ScriptCommand('file', '/abs/train.py', ('--epochs', '3')).

    The interpreter word may be left out (`-- train.py ARGS`). The script always runs in this
    interpreter: another python on the command line is named for the user's habit, not obeyed.
    """
    words = list(argv)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        raise UsageError("nothing to run; give the script after --, e.g. dtype-doctor run -- python train.py")
    if _PYTHON.search(words[0]):
        words = words[1:]
        while words and (words[0] in _HARMLESS_FLAGS or words[0].startswith(("-W", "-X"))):
            flag = words.pop(0)
            if flag in ("-W", "-X") and words:
                words.pop(0)  # the flag's value
        if words and words[0] == "-c":
            raise UsageError("python -c is not supported; put the code in a file and run that")
    if not words:
        raise UsageError("no script given after python; e.g. dtype-doctor run -- python train.py")
    if words[0] == "-m":
        if len(words) < 2:
            raise UsageError("python -m needs a module name")
        return ScriptCommand("module", words[1], tuple(words[2:]))
    if words[0].startswith("-"):
        raise UsageError(f"unsupported python option {words[0]!r}; run a FILE or -m MODULE")
    path = Path(words[0])
    if not path.is_file():
        raise InputError(f"script {words[0]}: no such file")
    return ScriptCommand("file", str(path.resolve()), tuple(words[1:]), words[0])
