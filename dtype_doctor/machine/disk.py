"""The file system a `--simulate` script sees: its writes land in a scratch directory, never on the user's files.

A simulated step holds tensors without data. A script that saves them (`torch.save(ckpt,
"out/ckpt.pt")` after its step) would replace a real checkpoint with meta tensors and stand-in
values. So while a simulated script runs, the file system is an overlay: the user's files are
the lower layer, read as they are; every write goes to the upper layer, a scratch directory;
a removal or a move away of a user's file hides it (a whiteout) instead. Reads of a file the
script wrote earlier in the run find the scratch copy, so a script that saves and loads again
still runs. What the script wrote is listed in the report (`writes`), and `--keep-writes DIR`
keeps it.

The overlay sits at Python's file API, the one door of pure-Python writers (numpy, pickle,
pathlib, logging, shutil, zipfile, fsspec): `open`, and `os`'s path functions that create,
move, remove or describe files. Writers in compiled code that open a path themselves (torch's
zip writer, TorchScript, safetensors, SQLite, Arrow) are routed by name (COMPILED), as are an
AF_UNIX socket's bind and a FIFO: no audit event sees those opens. Behind both, an audit hook
(`sys.addaudithook`) sees every file opened for writing, moved or removed through CPython;
one that reaches a user's path unrouted is refused with PermissionError, so a path the overlay
missed is an error in the script, never a changed file. Library caches (Hugging Face, torch's
compile caches, `__pycache__`) and devices are written as they are: they belong to no script.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

from dtype_doctor.machine.disk_layers import REAL, Layers, copy_file, real_open as _open, real_rmtree as _rmtree
from dtype_doctor.records import SourceLoc

# The real functions (REAL, _open: machine/disk_layers.py), taken before any patch: the overlay's own work goes through these.
_mkdtemp, _mkstemp_inner = tempfile.mkdtemp, tempfile._mkstemp_inner  # type: ignore[attr-defined]
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# Writers and readers in compiled code that open a path themselves: (module, attribute, index of the path argument,
# its keyword, "write" | "read"). Each is wrapped when its module is imported.
COMPILED: tuple[tuple[str, str, int, str, str], ...] = (
    ("torch.serialization", "_open_zipfile_writer", 0, "name_or_buffer", "write"),  # torch.save: PyTorchFileWriter(path)
    ("safetensors.torch", "serialize_file", 1, "filename", "write"),  # save_file / save_model / save_pretrained
    ("safetensors.numpy", "serialize_file", 1, "filename", "write"),
    ("safetensors.torch", "safe_open", 0, "filename", "read"),  # load_file of a file written in this run
    ("transformers.modeling_utils", "safe_open", 0, "filename", "read"),  # from_pretrained of a directory saved in this run
    ("pyarrow", "memory_map", 0, "path", "read"),  # datasets reads the cache files its map() wrote
    ("pyarrow", "input_stream", 0, "source", "read"),
    ("pyarrow.parquet", "write_table", 1, "where", "write"),
    ("pyarrow.parquet", "read_table", 0, "source", "read"),
    ("tokenizers", "Tokenizer.save", 1, "path", "write"),  # a fast tokenizer's save_pretrained writes tokenizer.json in Rust
    ("tokenizers", "Tokenizer.from_file", 0, "path", "read"),
    ("torch.jit._script", "RecursiveScriptModule.save", 1, "f", "write"),  # torch.jit.save(m, path): C++ writes the zip
    ("torch.jit", "load", 0, "f", "read"),
    ("sqlite3", "connect", 0, "database", "update"),  # a run log or an optuna study: SQLite opens the file in C
    ("pyarrow", "OSFile", 0, "path", "by-mode"),  # pandas' to_parquet opens its local path with pa.OSFile(path, "wb")
    ("pyarrow.feather", "write_feather", 1, "dest", "write"),
    ("pyarrow.feather", "read_table", 0, "source", "read"),
    ("pyarrow.feather", "_read_table_internal", 0, "source", "read"),  # read_feather's reader
    ("pyarrow.csv", "write_csv", 1, "output_file", "write"),
)
_NOT_A_PATH = frozenset({"", ":memory:", b"", b":memory:"})  # SQLite's in-memory databases


class Overlay(Layers):
    """`with Overlay() as disk:` — while armed, the process's file writes go to `disk.root`.

    `held()` lists what was written (the report's `writes`); `keep(dir)` copies it there;
    `paused()` lets the doctor's own writes (the report file) through.
    """

    def __init__(self, site: Callable[[], SourceLoc | None] = lambda: None) -> None:
        super().__init__(site)
        self._saved: list[tuple[Any, str, Any]] = []  # the os and io functions armed, to put back
        self._hooks: list[Any] = []  # the import hooks that route compiled writers

    # ------------------------------------------------------------ the script's os functions

    def open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("opener") is not None or len(args) >= 6:
            return _open(file, mode, *args, **kwargs)  # the opener opens the path (tempfile's calls os.open)
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            file = self.write_path(file, update=("a" in mode or "+" in mode) and "w" not in mode, exclusive="x" in mode)
        else:
            file = self.read_path(file)
        return _open(file, mode, *args, **kwargs)

    def os_open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is None:
            if flags & _WRITE_FLAGS:
                path = self.write_path(path, update=not flags & os.O_TRUNC, exclusive=bool(flags & os.O_EXCL and flags & os.O_CREAT))
            else:
                path = self.read_path(path)
        return REAL["open"](path, flags, mode, dir_fd=dir_fd)

    def stat(self, path: Any, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> os.stat_result:
        real = REAL["stat"] if follow_symlinks else REAL["lstat"]
        key = self.path_key(path)
        if dir_fd is not None or self.passes(key) or not self.touched():
            return real(path, dir_fd=dir_fd) if follow_symlinks else real(path, dir_fd=dir_fd)
        assert key is not None
        if self.upper(key) is not None and (self.in_upper(key) or self.lower(key) is None):
            return real(self.scratch(key))
        if self.is_hidden(key):
            raise self.missing(path)
        return real(path)

    def lstat(self, path: Any, *, dir_fd: int | None = None) -> os.stat_result:
        return self.stat(path, dir_fd=dir_fd, follow_symlinks=False)

    def listdir(self, path: Any = ".") -> list:
        key = self.path_key(path)
        if self.passes(key) or not self.touched():
            return REAL["listdir"](path)
        assert key is not None
        if not self.is_dir(key):
            if self.visible(key):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fsdecode(os.fspath(path)))
            raise self.missing(path)
        names = set(REAL["listdir"](key)) if self.lower(key) is not None else set()
        names = {n for n in names if not self.is_hidden(os.path.join(key, n))}
        if self.upper(key) is not None:
            names |= set(REAL["listdir"](self.scratch(key)))
        out = sorted(names)
        return [os.fsencode(n) for n in out] if isinstance(path, bytes) else out

    def scandir(self, path: Any = ".") -> Any:
        key = self.path_key(path)
        if self.passes(key) or not self.touched():
            return REAL["scandir"](path)
        from dtype_doctor.machine.disk_listing import merged

        return merged(path, self.listdir(path), self.stat)

    def resolved(self, name: str) -> Callable[..., Any]:
        """os.statvfs / os.access / os.readlink / os.listxattr / os.getxattr: asked of the file the script would
        open (its scratch copy)."""
        real = REAL[name]

        def ask(path: Any = None, *args: Any, **kwargs: Any) -> Any:
            out = real(path if kwargs.get("dir_fd") is not None else self.read_path(path), *args, **kwargs)
            if name == "readlink" and isinstance(out, str) and self.root and out.startswith(self.root + os.sep):
                return os.sep + os.path.relpath(out, self.root)  # a link the script made names the file it named
            return out

        return ask

    def link(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None,
             follow_symlinks: bool = True) -> None:
        """os.link: the new name holds the same bytes, in scratch (a hard link to a user's file would let a
        later write through it change the user's file)."""
        if src_dir_fd is not None or dst_dir_fd is not None or self.passes(self.path_key(dst)):
            return REAL["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks)
        copy_file(self.read_path(src), self.write_path(dst, exclusive=True))

    def symlink(self, src: Any, dst: Any, target_is_directory: bool = False, *, dir_fd: int | None = None) -> None:
        """os.symlink: the link in scratch, to the file the script's view names (a relative target from the link's folder)."""
        key = self.path_key(dst)
        if dir_fd is not None or self.passes(key):
            return REAL["symlink"](src, dst, target_is_directory, dir_fd=dir_fd)
        assert key is not None
        target = os.fsdecode(src)
        REAL["symlink"](self.read_path(os.path.join(os.path.dirname(key), target)), self.write_path(dst, exclusive=True))

    def temporary(self, make: Callable[..., Any], dir_at: int) -> Callable[..., Any]:
        """tempfile.mkdtemp / its mkstemp: a fresh name in the system's temp directory is made for real
        (no user file had it; C code that binds a socket there, multiprocessing's, finds it) and owned."""

        def made(*args: Any, **kwargs: Any) -> Any:
            where = kwargs.get("dir", args[dir_at] if len(args) > dir_at else None)
            key = self.path_key(where) if where is not None else None
            if key is not None and key != self.path_key(tempfile.gettempdir()) and not self.passes(key):
                return make(*args, **kwargs)  # a temporary file among the user's: the overlay's
            with self.paused():
                out = make(*args, **kwargs)
            owned = self.path_key(out if isinstance(out, (str, bytes)) else out[1])
            if owned is not None:
                self.owned.add(owned)
                self.owned_under += (owned + os.sep,)
            return out

        return made

    def mkdir(self, path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        key = self.path_key(path)
        if dir_fd is not None or self.passes(key) or self.toward_exempt(key):
            return REAL["mkdir"](path, mode, dir_fd=dir_fd)
        assert key is not None
        if self.visible(key):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(os.fspath(path)))
        if not self.is_dir(os.path.dirname(key)):
            raise self.missing(path)
        self.mirror(os.path.dirname(key))
        REAL["mkdir"](self.scratch(key), mode)

    def replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        s, d = self.path_key(src), self.path_key(dst)
        if src_dir_fd is not None or dst_dir_fd is not None or (self.passes(s) and self.passes(d)):
            return REAL["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        assert s is not None and d is not None
        if not self.visible(s):
            raise self.missing(src)
        if self.is_dir(d) and not self.is_dir(s):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(os.fspath(dst)))
        if not self.is_dir(os.path.dirname(d)):
            raise self.missing(dst)
        self.mirror(os.path.dirname(d))
        target = self.scratch(d) if not self.passes(d) else d
        if not self.passes(d) and self.upper(d) is not None and self.is_dir(d):
            _rmtree(self.scratch(d))
        moved = self.upper(s) is not None and not self.passes(s)
        if moved:
            REAL["replace"](self.scratch(s), target)
        elif self.passes(s):
            REAL["replace"](src, target)  # out of a cache or a temp area of the doctor's: the file is the script's now
        elif self.is_dir(s):
            shutil.copytree(s, target, copy_function=copy_file, dirs_exist_ok=True)
        else:
            copy_file(s, target)
        if not self.passes(s):
            if self.lower(s) is not None:
                self.hidden.add(s)
            written = [k for k in self.written if k == s or k.startswith(s + os.sep)]
            for k in written:
                del self.written[k]
                if not self.passes(d):
                    self.note(d + k[len(s):])
        if not self.passes(d):
            if self.is_dir(d):
                for dirpath, _dirs, files in os.walk(self.scratch(d)):
                    for f in files:
                        rel = os.path.relpath(os.path.join(dirpath, f), self.scratch(d))
                        if os.path.join(d, rel) not in self.written:
                            self.note(os.path.join(d, rel))
            else:
                self.note(d)

    def remove(self, path: Any, *, dir_fd: int | None = None) -> None:
        key = self.path_key(path)
        if dir_fd is not None or self.passes(key):
            return REAL["remove"](path, dir_fd=dir_fd)
        assert key is not None
        if self.is_dir(key):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fsdecode(os.fspath(path)))
        if not self.visible(key):
            raise self.missing(path)
        if self.upper(key) is not None:
            REAL["remove"](self.scratch(key))
            self.forget(key)
        if self.lower(key) is not None:
            self.hidden.add(key)

    def rmdir(self, path: Any, *, dir_fd: int | None = None) -> None:
        key = self.path_key(path)
        if dir_fd is not None or self.passes(key):
            return REAL["rmdir"](path, dir_fd=dir_fd)
        assert key is not None
        if not self.is_dir(key):
            raise self.missing(path) if not self.visible(key) else NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        if self.listdir(key):
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), os.fsdecode(os.fspath(path)))
        if self.upper(key) is not None:
            REAL["rmdir"](self.scratch(key))
        if self.lower(key) is not None:
            self.hidden.add(key)

    def rmtree(self, path: Any, ignore_errors: bool = False, onerror: Any = None, **kwargs: Any) -> None:
        key = self.path_key(path)
        if self.passes(key):
            return _rmtree(path, ignore_errors, onerror, **kwargs)
        assert key is not None
        if not self.is_dir(key):
            if ignore_errors:
                return None
            raise self.missing(path) if not self.visible(key) else NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        if self.upper(key) is not None:
            _rmtree(self.scratch(key))
        self.forget(key)
        if self.lower(key) is not None:
            self.hidden.add(key)

    def metadata(self, name: str) -> Callable[..., Any]:
        """os.chmod / os.utime / os.truncate / os.setxattr / os.removexattr / os.chown: on a file the script wrote,
        its scratch copy; a user's file is copied up first."""
        real = REAL[name]

        def change(path: Any, *args: Any, **kwargs: Any) -> Any:
            key = self.path_key(path)
            if kwargs.get("dir_fd") is not None or self.passes(key):
                return real(path, *args, **kwargs)
            assert key is not None
            if self.is_dir(key):
                if self.upper(key) is None:
                    return None  # a user's directory keeps its mode and times
                return real(self.scratch(key), *args, **kwargs)
            return real(self.write_path(path, update=True), *args, **kwargs)

        return change

    # ------------------------------------------------------------ arming

    def __enter__(self) -> "Overlay":
        self.root = tempfile.mkdtemp(prefix="dtype-doctor-writes-")
        import atexit

        atexit.register(self.cleanup)  # the scratch goes with the process, whatever ended the run
        self.exempt = tuple(os.path.join(os.path.abspath(p), "") for p in (self.root, *_library_caches()))
        return self._arm()

    @classmethod
    def joined(cls, state: tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]) -> "Overlay":
        """The parent's overlay, armed in a spawned child: its writes land in the parent's scratch (which
        the parent lists and removes); the child never removes it."""
        disk = cls()
        disk.root, disk.exempt, hidden, owned = state
        disk.hidden = set(hidden)
        disk.owned = set(owned)
        disk.owned_under = tuple(o + os.sep for o in owned)
        disk.made = True
        return disk._arm()

    def _arm(self) -> "Overlay":
        global _ARMED
        patches = {
            (builtins, "open"): self.open, (io, "open"): self.open,
            (os, "open"): self.os_open, (os, "stat"): self.stat, (os, "lstat"): self.lstat, (os, "listdir"): self.listdir,
            (os, "mkdir"): self.mkdir, (os, "replace"): self.replace, (os, "rename"): self.replace,
            (os, "remove"): self.remove, (os, "unlink"): self.remove, (os, "rmdir"): self.rmdir,
            (shutil, "rmtree"): self.rmtree, (os, "scandir"): self.scandir,
            (os, "statvfs"): self.resolved("statvfs"), (os, "access"): self.resolved("access"),
            (os, "readlink"): self.resolved("readlink"), (os, "link"): self.link, (os, "symlink"): self.symlink,
            (tempfile, "mkdtemp"): self.temporary(_mkdtemp, 2), (tempfile, "_mkstemp_inner"): self.temporary(_mkstemp_inner, 0),
            (os, "chmod"): self.metadata("chmod"), (os, "utime"): self.metadata("utime"), (os, "truncate"): self.metadata("truncate"),
        }
        patches.update({**_attribute_calls(self), **_special_files(self)})
        for (owner, name), fn in patches.items():
            self._set(owner, name, fn)
        from dtype_doctor.machine.libraries import after_import

        by_module: dict[str, list[tuple[str, int, str, str]]] = {}
        for module, attr, index, keyword, kind in COMPILED:
            by_module.setdefault(module, []).append((attr, index, keyword, kind))
        for module, rows in by_module.items():
            hook = after_import(module, lambda m, rows=rows: _route_compiled(self, m, rows))
            if hook is not None:
                self._hooks.append(hook)
        _install_net()
        _ARMED = self
        return self

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __exit__(self, *exc: Any) -> None:
        global _ARMED
        _ARMED = None
        for hook in self._hooks:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        self._hooks.clear()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

def _attribute_calls(disk: Overlay) -> dict[tuple[Any, str], Any]:
    """Extended attributes and owners (Linux), which shutil.copy2 / copytree / move carry over after the bytes."""
    answers = {"listxattr": disk.resolved, "getxattr": disk.resolved, "setxattr": disk.metadata,
               "removexattr": disk.metadata, "chown": disk.metadata}
    return {(os, name): answer(name) for name, answer in answers.items() if hasattr(os, name)}


def _special_files(disk: Overlay) -> dict[tuple[Any, str], Any]:
    """A FIFO (os.mkfifo / os.mknod) and an AF_UNIX socket's file (bind; connect reads it) among the user's
    files: made in C, seen by no audit event, held back as a file is."""
    out: dict[tuple[Any, str], Any] = {(os, name): _node(disk, REAL[name]) for name in ("mkfifo", "mknod") if name in REAL}
    for name in ("bind", "connect", "connect_ex"):
        out[(socket.socket, name)] = _unix_address(disk, getattr(socket.socket, name), write=name == "bind")
    return out


def _node(disk: Overlay, real: Callable[..., Any]) -> Callable[..., Any]:
    def make(path: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dir_fd") is not None:
            return real(path, *args, **kwargs)
        return real(disk.write_path(path, exclusive=True), *args, **kwargs)

    return make


def _unix_address(disk: Overlay, real: Callable[..., Any], write: bool) -> Callable[..., Any]:
    """An abstract address ("\\0name") is no file; a path in scratch longer than AF_UNIX's limit (108) is
    named through its folder's descriptor."""

    def call(sock: Any, address: Any, *args: Any, **kwargs: Any) -> Any:
        if sock.family == getattr(socket, "AF_UNIX", None) and _a_path(address) and address[:1] not in ("\0", b"\0"):
            address = disk.write_path(address, exclusive=True) if write else disk.read_path(address)
            if len(os.fsencode(address)) > 100:
                fd = REAL["open"](os.path.dirname(address), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                try:
                    return real(sock, f"/proc/self/fd/{fd}/{os.path.basename(os.fsdecode(address))}", *args, **kwargs)
                finally:
                    os.close(fd)
        return real(sock, address, *args, **kwargs)

    return call


def _route_compiled(disk: Overlay, module: Any, rows: list[tuple[str, int, str, str]]) -> None:
    """The compiled writers and readers of `module` (COMPILED's rows) given the path the overlay routes."""
    for attr, index, keyword, kind in rows:
        owner_name, _, attr = attr.rpartition(".")
        owner = getattr(module, owner_name, None) if owner_name else module
        original = getattr(owner, attr, None) if owner is not None else None
        if original is None:
            continue

        def routed(*args: Any, _original: Any = original, _index: int = index, _keyword: str = keyword, _kind: str = kind, **kwargs: Any) -> Any:
            route = _route(disk, _kind, args[_index + 1] if len(args) > _index + 1 else kwargs.get("mode", "r"))
            if len(args) > _index and _a_path(args[_index]):
                args = (*args[:_index], route(args[_index]), *args[_index + 1:])
            elif _a_path(kwargs.get(_keyword)):
                kwargs[_keyword] = route(kwargs[_keyword])
            return _original(*args, **kwargs)

        disk._set(owner, attr, routed)


def _a_path(value: Any) -> bool:
    if isinstance(value, str) and value.startswith("file:"):
        return False  # a SQLite URI names its file itself
    return isinstance(value, (str, bytes, os.PathLike)) and value not in _NOT_A_PATH


def _route(disk: Overlay, kind: str, mode: Any) -> Callable[[Any], Any]:
    """How a COMPILED row's path is routed: a write, a read, an update (the user's content copied up first, as
    SQLite reads and writes one file), or by the call's mode ("rb" a read, "wb"/"ab" a write)."""
    if kind == "by-mode":
        if not isinstance(mode, str) or mode.startswith("r"):
            return disk.read_path
        kind = "update" if "a" in mode else "write"
    if kind == "update":
        return lambda p: disk.write_path(p, update=True)
    return disk.write_path if kind == "write" else disk.read_path


def _library_caches() -> list[str]:
    """Where libraries keep their caches: written as they are, the script's step is not in them."""
    import getpass

    home = os.path.expanduser("~")
    env = os.environ.get
    try:
        user = getpass.getuser()  # what inductor names its default cache directory after
    except (KeyError, OSError):
        user = env("USER") or env("USERNAME") or "user"
    caches = [env("XDG_CACHE_HOME") or os.path.join(home, ".cache"), os.path.join(home, ".triton"),
              os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"), "/dev", "/proc"]
    for name in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME",
                 "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
        if env(name):
            caches.append(env(name))  # type: ignore[arg-type]
    return caches


# ------------------------------------------------------------------ the net

_ARMED: Overlay | None = None
_NET = False
# Audit events that change a path: event → (index of the path, index of its dir_fd or None), per path.
_NETTED: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.rename": ((0, 2), (1, 3)), "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.truncate": ((0, None),),
    "shutil.rmtree": ((0, 1),), "os.mkdir": ((0, 2),), "os.link": ((1, 3),), "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),), "os.utime": ((0, 3),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "os.chown": ((0, 3),),
}


def _install_net() -> None:
    """One audit hook for the process (hooks cannot be removed): it acts only while an overlay is armed."""
    global _NET
    if not _NET:
        sys.addaudithook(_audit)
        _NET = True


def _audit(event: str, args: tuple) -> None:
    disk = _ARMED
    if disk is None:
        return
    if event == "open":
        if len(args) < 3 or not isinstance(args[2], int) or not args[2] & _WRITE_FLAGS:
            return
        paths: list[Any] = [args[0]]
    elif event in _NETTED:
        paths = []
        for at, fd_at in _NETTED[event]:
            if at < len(args):
                fd = args[fd_at] if fd_at is not None and fd_at < len(args) else None
                paths.append(_under_fd(args[at], fd) if isinstance(fd, int) and fd >= 0 else args[at])
    else:
        return
    for p in paths:
        key = disk.path_key(p)
        if key is not None and not disk.passes(key) and not (event == "os.mkdir" and disk.toward_exempt(key)):
            if event == "open" and disk.is_dir(key):
                continue  # io.open(dir, opener=...): the opener's os.open names the file, and is routed
            raise PermissionError(errno.EACCES, f"dtype-doctor --simulate holds back writes to the user's files, and this one "
                                  f"({event}) reached the file system past its overlay", os.fsdecode(os.fspath(p)))


def _under_fd(path: Any, fd: int) -> Any:
    """A path relative to a directory descriptor, as the absolute path it names (Linux's /proc)."""
    try:
        if os.path.isabs(os.fsdecode(path)):
            return path
        return os.path.join(os.readlink(f"/proc/self/fd/{fd}"), os.fsdecode(path))
    except (OSError, TypeError):
        return path
