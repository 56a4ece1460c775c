"""The user's files: what the tool writes never lands on what it reads, and never half-written.

Every file the tool writes goes through `write_atomic`: a temporary file beside the target,
flushed, then renamed over it, so a write that fails (disk full, a file-size limit, an
interrupt) leaves the previous file as it was. `refuse_overlap` runs before anything loads:
an output that names a file the command reads (or lies inside a dataset or model directory
it reads) is a usage error, so a report never replaces the data it reports on.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable

from dtype_doctor.records.errors import InputError, UsageError


def write_atomic(path: Path, text: str | bytes, *, exclusive: bool = False, what: str = "the report") -> None:
    """Write `text` (str as UTF-8, or bytes as they are) to `path` through a temporary file in the same directory, renamed into place.

    `exclusive`: refuse when `path` exists (checked again just before the rename).
    Any failure raises UsageError naming `path`; the temporary file is removed and an
    existing `path` is untouched."""
    path = Path(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"cannot write {what} to {path}: it is a directory")
    if str(path.absolute()).startswith(("/dev/", "/proc/")) or (path.exists() and not path.is_file()):
        # /dev/stdout, /proc/self/fd/N, a named pipe: a stream to write into, not a file to replace
        try:
            with open(path, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise UsageError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # replace the file the link points to, keep the link
        parent = path.parent
    tmp: str | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _set_mode(path, tmp)
        if exclusive:
            try:
                os.link(tmp, path)  # fails when path appeared meanwhile: never replaced
            except FileExistsError:
                raise UsageError(f"{what.removeprefix('the ')} file {path} already exists; refusing to overwrite it") from None
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise UsageError(f"cannot write {what} to {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _set_mode(path: Path, tmp: str) -> None:
    """The replaced file's permission bits, else what open() would give (0666 less the umask):
    mkstemp's 0600 would make a report private."""
    try:
        mode = path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        os.chmod(tmp, mode)
    except OSError:
        pass


def local_inputs(*specs: str | Path | None) -> list[Path]:
    """The existing local paths among `specs` (a model or dataset given as a hub id is not one);
    `FILE.py:FUNC` counts as FILE.py."""
    out = []
    for spec in specs:
        if spec is None or spec == "":
            continue
        text = str(spec)
        if ".py:" in text:
            text = split_spec(text)[0]
        p = Path(text).expanduser()
        if p.exists():
            out.append(p.resolve())
    return out


def refuse_overlap(outputs: Iterable[tuple[str, Path | None]], inputs: Iterable[Path]) -> None:
    """UsageError when an output (flag, path) is one of `inputs`, lies inside an input directory,
    or is the same file as another output — before anything runs."""
    ins = [Path(p).resolve() for p in inputs]
    seen: dict[Path, str] = {}
    for flag, out in outputs:
        if out is None:
            continue
        target = Path(out).expanduser().resolve()
        for src in ins:
            if target == src or (src.is_dir() and target.is_relative_to(src)):
                if target == src or target.is_file():
                    raise UsageError(f"{flag} {out} is a file this command reads; write it somewhere else")
                raise UsageError(f"{flag} {out} lies inside {src}, which this command reads; write it somewhere else")
        if target in seen:
            raise UsageError(f"{flag} and {seen[target]} name the same file {out}; give them different paths")
        seen[target] = flag


def read_json_object(file: Path, shown: str, what: str) -> dict:
    """A JSON file that must hold one object (a device map, a DeepSpeed config): its dict, or one
    InputError naming `shown` (the path as the user gave it) and `what` it should be."""
    import json

    try:
        data = json.loads(Path(file).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{shown}: cannot read {what} ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{shown}: {what} is a JSON object")
    return data


def split_spec(spec: str) -> tuple[str, str]:
    """'prep.py:tokenize' → ('prep.py', 'tokenize'): the one place FILE.py:FUNC is split."""
    file, sep, func = spec.rpartition(":")
    if not sep or not file or not func or not func.isidentifier():
        raise UsageError(f"--preprocess must be FILE.py:FUNC, got {spec!r}")
    return file, func
