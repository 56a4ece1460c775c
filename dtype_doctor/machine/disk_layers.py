"""The layers of the file system a `--simulate` script sees (machine/disk.py arms them): the user's files
below, read as they are, and a scratch directory above that every write of the script lands in; a removal or a
move away of a user's file hides it instead. Which path a read or a write opens, and what was written."""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Any, Callable

from dtype_doctor.records import HeldWrite, SourceLoc

# The real functions, taken before any patch: the overlay's own work goes through these.
real_open = builtins.open
REAL = {name: getattr(os, name) for name in ("open", "stat", "lstat", "replace", "rename", "remove", "unlink", "rmdir",
                                             "mkdir", "listdir", "chmod", "utime", "truncate", "scandir", "statvfs",
                                             "access", "readlink", "symlink", "link", "mkfifo", "mknod") if hasattr(os, name)}
# Extended attributes and owners (Linux): shutil.copy2 / copytree / move copy them after the bytes.
REAL.update({name: getattr(os, name) for name in ("listxattr", "getxattr", "setxattr", "removexattr", "chown")
             if hasattr(os, name)})
real_rmtree = shutil.rmtree


@dataclass(frozen=True)
class Written:
    key: str  # the absolute path the script named
    source: SourceLoc | None




class Layers:
    """The two layers and the scratch directory's bookkeeping: `read_path` and `write_path` say which file a
    call opens; `held()` lists what was written (the report's `writes`), `keep(dir)` copies it there;
    `paused()` lets the doctor's own writes (the report file) through."""

    def __init__(self, site: Callable[[], SourceLoc | None] = lambda: None) -> None:
        self.site = site
        self.root = ""
        self.written: dict[str, Written] = {}  # key → the last write's source, in first-write order
        self.hidden: set[str] = set()  # whiteouts: user paths the script removed or moved away
        self.pause_depth = 0
        self.made = False  # the scratch layer holds something: reads and listings look there
        self.exempt: tuple[str, ...] = ()
        # What tempfile made in the system's temp directory (multiprocessing's socket folder, a library's
        # NamedTemporaryFile): a fresh name no user file had, real, so C code (a socket's bind) finds it.
        self.owned: set[str] = set()
        self.owned_under: tuple[str, ...] = ()

    # ------------------------------------------------------------ paths

    def path_key(self, path: Any) -> str | None:
        if isinstance(path, int):
            return None  # a file descriptor: already open
        try:
            return os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return None

    def passes(self, key: str | None) -> bool:
        """Written as it is: not a path, the doctor writing, scratch itself, a cache or a device."""
        return key is None or self.pause_depth > 0 or not self.root or (key + os.sep).startswith(self.exempt) \
            or f"{os.sep}__pycache__{os.sep}" in key or key in self.owned or key.startswith(self.owned_under)

    def toward_exempt(self, key: str | None) -> bool:
        """`key` is a folder on the way to a cache that does not exist yet (HF_DATASETS_CACHE=.hf-home/datasets
        on a fresh runner): os.makedirs makes it for real, as the plain script does, so the cache under it can be."""
        return key is not None and any(e.startswith(key + os.sep) for e in self.exempt)

    def scratch(self, key: str) -> str:
        return os.path.join(self.root, os.path.splitdrive(key)[1].lstrip(os.sep))

    def is_hidden(self, key: str) -> bool:
        return any(key == h or key.startswith(h + os.sep) for h in self.hidden)

    def upper(self, key: str) -> os.stat_result | None:
        try:
            return REAL["lstat"](self.scratch(key))
        except OSError:
            return None

    def lower(self, key: str) -> os.stat_result | None:
        if self.is_hidden(key):
            return None
        try:
            return REAL["stat"](key)
        except OSError:
            return None

    def visible(self, key: str) -> bool:
        return self.upper(key) is not None or self.lower(key) is not None

    def is_dir(self, key: str) -> bool:
        up, low = self.upper(key), self.lower(key)
        return (up is not None and stat.S_ISDIR(up.st_mode)) or (up is None and low is not None and stat.S_ISDIR(low.st_mode))

    def in_upper(self, key: str) -> bool:
        up = self.upper(key)
        return up is not None and not stat.S_ISDIR(up.st_mode)

    def touched(self) -> bool:
        return self.made or bool(self.written or self.hidden)

    @staticmethod
    def missing(path: Any) -> FileNotFoundError:
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(os.fspath(path)))

    # ------------------------------------------------------------ routing

    def read_path(self, path: Any) -> Any:
        """The path a read of `path` opens: the scratch copy when the script wrote one."""
        key = self.path_key(path)
        if self.passes(key) or not self.touched():
            return path
        assert key is not None
        if self.in_upper(key) or (self.upper(key) is not None and self.lower(key) is None):
            return self.scratch(key)  # a file the script wrote, or a directory it made
        if self.is_hidden(key):
            raise self.missing(path)
        return path

    def write_path(self, path: Any, *, update: bool = False, exclusive: bool = False) -> Any:
        """The path a write of `path` opens: its place in scratch, made ready (`update`: the user's
        content copied up first, as for "a" and "r+")."""
        key = self.path_key(path)
        if self.passes(key):
            return path
        assert key is not None
        if exclusive and self.visible(key):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(os.fspath(path)))
        if self.is_dir(key):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(os.fspath(path)))
        parent = os.path.dirname(key)
        if not self.is_dir(parent):
            raise self.missing(path)
        target = self.scratch(key)
        self.mirror(parent)
        if update and self.upper(key) is None and self.lower(key) is not None:
            with real_open(key, "rb") as src, real_open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
        self.note(key)
        return target

    def mirror(self, parent: str) -> None:
        """The scratch directories down to `parent`, which the script's view already has."""
        missing = []
        d = parent
        while self.upper(d) is None:
            missing.append(d)
            up = os.path.dirname(d)
            if up == d:
                break
            d = up
        self.made = True
        for d in reversed(missing):
            try:
                REAL["mkdir"](self.scratch(d))
            except FileExistsError:
                pass

    def note(self, key: str) -> None:
        self.written.pop(key, None)  # the last write's line; order by the first write stays below
        self.written[key] = Written(key, self.site())

    def forget(self, key: str) -> None:
        for k in [k for k in self.written if k == key or k.startswith(key + os.sep)]:
            del self.written[k]

    def state(self) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """What a child process needs to see this file system: (scratch, exempt, hidden, owned)."""
        return self.root, self.exempt, tuple(self.hidden), tuple(self.owned)

    def paused(self) -> "Paused":
        return Paused(self)

    # ------------------------------------------------------------ what was written

    def held(self) -> tuple[HeldWrite, ...]:
        """The files the script wrote that are still there at the end: path as the user named it, size, line."""
        return tuple(w for _key, w in self.held_keys())

    def held_keys(self) -> list[tuple[str, HeldWrite]]:
        from dtype_doctor.machine.user_code import display_path

        out = []
        for key, w in {**self.written, **self.children_wrote()}.items():
            try:
                size = REAL["stat"](self.scratch(key)).st_size
            except OSError:
                continue
            shown = os.path.join(display_path(os.path.dirname(key)), os.path.basename(key))  # a link is named, not followed
            out.append((key, HeldWrite(os.path.normpath(shown), size, w.source)))
        return out

    def children_wrote(self) -> dict[str, Written]:
        """Files in scratch this process did not write: a child process's (a DataLoader worker's), no line."""
        found: dict[str, Written] = {}
        if not self.root:
            return found
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                key = os.sep + os.path.relpath(os.path.join(dirpath, f), self.root)
                if key not in self.written:
                    found[key] = Written(key, None)
        return found

    def keep(self, directory: str) -> list[str]:
        """Copy the held files into `directory`, each at its path as the report names it (relative
        to the working directory, or the absolute path below `directory`)."""
        kept = []
        with self.paused():
            for key, w in self.held_keys():
                target = os.path.join(directory, os.path.splitdrive(w.path)[1].lstrip(os.sep))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                copy_file(self.scratch(key), target)
                kept.append(target)
        return kept

    def cleanup(self) -> None:
        if self.root:
            real_rmtree(self.root, ignore_errors=True)
            self.root = ""
            import atexit

            atexit.unregister(self.cleanup)



class Paused:
    def __init__(self, disk: Layers) -> None:
        self.disk = disk

    def __enter__(self) -> None:
        self.disk.pause_depth += 1

    def __exit__(self, *exc: Any) -> None:
        self.disk.pause_depth -= 1


def copy_file(src: str, dst: str) -> str:
    with real_open(src, "rb") as a, real_open(dst, "wb") as b:
        shutil.copyfileobj(a, b)
    return dst


