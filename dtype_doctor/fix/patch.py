"""Unified diffs of the codemods' output, written as one patch file that `git apply` accepts.

Diffs come from difflib on the original and the rewritten text, so every line a codemod
did not touch appears only as context, byte for byte. Paths inside the patch are relative
to a root (the git repository holding the user's file, else the current directory) and
carry git's ``a/`` and ``b/`` prefixes; a new file is diffed against ``/dev/null``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import UsageError
from dtype_doctor.source.analysis import read_source

__all__ = ["Patch", "unified_diff", "file_diff", "write_patch", "make_patch", "repo_root", "path_in_patch", "read_source"]

_NO_NEWLINE = "\\ No newline at end of file\n"


@dataclass(frozen=True, slots=True)
class Patch:
    """A written patch: where it is and the files it changes (paths as inside the patch)."""

    path: Path
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "files": list(self.files)}


def repo_root(start: Path) -> Path:
    """The git work tree holding `start`, else the current directory."""
    start = Path(start).resolve()
    for folder in (start, *start.parents) if start.is_dir() else start.parents:
        if (folder / ".git").exists():
            return folder
    return Path.cwd().resolve()


def path_in_patch(file: Path, root: Path) -> str:
    """`file` relative to `root`, with forward slashes, as a patch names it."""
    try:
        rel = Path(file).resolve().relative_to(Path(root).resolve())
    except ValueError:
        raise UsageError(f"{file} is not under {root}; a patch can only name files inside it") from None
    return rel.as_posix()


def _lines(text: str) -> list[str]:
    # Split on "\n" only, as git does (str.splitlines would also split on \f, \x1c, …).
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _quote(path: str) -> str:
    """A path as git writes it in a header: C-quoted when it holds quotes, backslashes or controls."""
    if not any(c in path for c in '"\\') and all(ord(c) >= 0x20 and c != "\x7f" for c in path):
        return path
    escapes = {'"': '\\"', "\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
    return '"' + "".join(escapes.get(c, f"\\{ord(c):03o}" if ord(c) < 0x20 or c == "\x7f" else c) for c in path) + '"'


def _header_path(prefix: str, path: str) -> str:
    quoted = _quote(path)
    return f'"{prefix}{quoted[1:]}' if quoted.startswith('"') else f"{prefix}{path}"


def unified_diff(path_in_patch: str, before: str, after: str, *, new_file: bool | None = None) -> str:
    """A git-style unified diff of one file; "" when nothing changed.

    `new_file` (default: `before == ""`) diffs against /dev/null so the patch creates it.
    """
    if before == after:
        return ""
    if new_file is None:
        new_file = before == ""
    a_path, b_path = _header_path("a/", path_in_patch), _header_path("b/", path_in_patch)
    out = [f"diff --git {a_path} {b_path}\n"]
    if new_file:
        out.append("new file mode 100644\n")
    out.append(f"--- {'/dev/null' if new_file else a_path}\n")
    out.append(f"+++ {b_path}\n")
    hunks = difflib.unified_diff(_lines(before), _lines(after), n=3, lineterm="\n")
    for i, line in enumerate(hunks):
        if i < 2:  # difflib's own ---/+++ lines; ours are above
            continue
        out.append(line if line.endswith("\n") else line + "\n" + _NO_NEWLINE)
    return "".join(out)


def file_diff(file: Path, before: str, after: str, *, root: Path, new_file: bool | None = None) -> str:
    """unified_diff for a file on disk, named relative to `root`."""
    return unified_diff(path_in_patch(file, root), before, after, new_file=new_file)


def write_patch(path: Path, diffs: Sequence[str], *, force: bool) -> None:
    """Write the diffs, in order, to `path` — and nothing else anywhere.

    Refuses (UsageError) to replace an existing file unless `force`.
    """
    path = Path(path)
    text = "".join(d if d.endswith("\n") or not d else d + "\n" for d in diffs)
    if path.is_dir():
        raise UsageError(f"cannot write the patch to {path}: it is a directory")
    if path.exists() and not force:
        raise UsageError(f"patch file {path} already exists; refusing to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write the patch to {path}: directory {parent} does not exist")
    from dtype_doctor.records.files import write_atomic

    write_atomic(path, text, exclusive=not force, what="the patch")


def make_patch(path: Path, edits: Iterable[tuple[Path, str, str]], *, root: Path, force: bool) -> Patch:
    """Diff each (file, before, after), write the patch to `path`, and describe it.

    Files whose text did not change are left out; a file whose `before` is "" and that does
    not exist is created by the patch.
    """
    diffs, files = [], []
    for file, before, after in edits:
        new_file = before == "" and not Path(file).exists()
        diff = file_diff(Path(file), before, after, root=root, new_file=new_file)
        if diff:
            diffs.append(diff)
            files.append(path_in_patch(Path(file), root))
    write_patch(path, diffs, force=force)
    return Patch(Path(path), tuple(files))

