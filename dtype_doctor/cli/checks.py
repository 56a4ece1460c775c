"""Command-line mistakes caught before torch is imported: one line, exit 2, a near name offered.

A user who mistypes a path or a value should not wait for torch and transformers to import
(seconds) to hear about it. Everything here reads the command line and the file system only;
the engines' own `validate()` methods (also torch-free) run right after, for what they know.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import Iterable

from dtype_doctor.records.choices import DTYPE_ALIASES, MODEL_DTYPES, choice, did_you_mean
from dtype_doctor.records.errors import InputError, UsageError

def dtype_name(value: str | None, flag: str) -> str | None:  # noqa: ARG001 - the flag names the caller in tracebacks
    """`fp16` → `float16`: an alias as its canonical name; anything else unchanged (checked later)."""
    if value is None:
        return None
    key = value.strip().lower()
    return DTYPE_ALIASES.get(key, key)


def component_dtypes(value: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A pipeline folder's --dtype: `float16`, `unet=bfloat16` or `float16,vae=float32` as (the
    pipeline's dtype, ((component, dtype), ...)); each dtype checked, aliases as their names."""
    base, components = "auto", []
    for part in (p.strip() for p in value.split(",")):
        name, _, dtype = part.rpartition("=")
        choice("--dtype", dtype_name(dtype, "--dtype"), MODEL_DTYPES[1:] if name else MODEL_DTYPES, aliases=tuple(DTYPE_ALIASES))
        if name:
            components.append((name.strip(), dtype_name(dtype, "--dtype") or dtype))
        else:
            base = dtype
    return base, tuple(components)


def gpu(value: str | None) -> None:
    """A --gpu that is neither a known profile nor a compute capability, with the nearest name."""
    if value is None:
        return
    from dtype_doctor.machine.gpus import CAPABILITIES, check_gpu

    try:
        check_gpu(value)
    except UsageError:
        hint = did_you_mean(value.strip(), CAPABILITIES)
        raise UsageError(f"unknown --gpu {value!r}{hint} (choose one of: {', '.join(CAPABILITIES)}, "
                         "or a compute capability such as 8.0)") from None


def device(value: str | None) -> None:
    from dtype_doctor.machine.placement import CUDA0, parse_device

    try:
        parse_device(value)
    except UsageError as exc:
        hint = did_you_mean(str(value), ("auto", "cpu", "cuda", CUDA0))
        raise UsageError(f"{exc}{hint}") from None


def codes(flag: str, value: str | None) -> None:
    """Each comma-separated code a known rule code or a prefix of one, else the nearest code."""
    if not value:
        return
    from dtype_doctor.rules import REDIRECTS, all_rules

    known = [r.code for r in all_rules()]
    for item in (c.strip().upper() for c in value.split(",") if c.strip()):
        item = REDIRECTS.get(item, item)
        if not any(k.startswith(item) for k in known):
            raise UsageError(f"unknown rule code or prefix {item!r} in {flag}{_near_code(item, known)} known rules: {', '.join(known)}")


def rule(code: str) -> None:
    """`dtype-doctor rule CODE`: a code or a name the catalogue has, else the nearest of either."""
    from dtype_doctor.rules import REDIRECTS, all_rules

    rules = all_rules()
    wanted = REDIRECTS.get(code.upper(), code.upper())
    if any(r.code == wanted or r.name == code.lower() for r in rules):
        return
    codes_ = [r.code for r in rules]
    near = _near_code(code.upper(), codes_)
    if near == ";":
        named = did_you_mean(code, [r.name for r in rules])
        near = f"{named}" if named else ";"
    raise UsageError(f"unknown rule {code!r}{near} known rules: {', '.join(codes_)}")


def _near_code(code: str, known: list[str]) -> str:
    """`; did you mean 'DD101'?` for a code with a letter for a digit (DD1O1, DDl01); else `;`."""
    fixed = code.translate(str.maketrans({"O": "0", "I": "1", "L": "1"}))
    if fixed != code and any(k.startswith(fixed) for k in known):
        return f"; did you mean {fixed!r}?"
    return ";"


def formats(fmt: str | None, known: Iterable[str], what: str = "") -> None:
    known = tuple(known)
    if fmt is not None and fmt not in known:
        raise UsageError(f"unknown format {fmt!r}{what}{did_you_mean(fmt, known)} (choose one of: {', '.join(known)})")


# ----------------------------------------------------------------------------- paths


def _kind(p: Path) -> str | None:
    """None for a regular file or a directory (after links); else what the path is instead."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse_special(p: Path, shown: str, what: str) -> None:
    kind = _kind(p)
    if kind is not None:
        # Reading one would block until a writer comes (a FIFO) or never end (a device).
        raise InputError(f"{shown} is {kind}, not a file or folder; pass {what}")


def _missing(shown: str, what: str) -> InputError:
    """`X: no such file or directory`, with the nearest name in its folder when there is one."""
    p = Path(shown).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    hint = ""
    try:
        if parent.is_dir():
            names = [e.name for e in os.scandir(parent)]
            near = difflib.get_close_matches(p.name, names, n=1, cutoff=0.6)
            if near:
                hint = f"; did you mean {str(parent / near[0]) if str(p.parent) not in ('', '.') else near[0]!r}?"
    except OSError:
        pass
    return InputError(f"{shown}: no such {what}{hint}")


def _looks_like_path(spec: str) -> bool:
    """A spec no hub id could be: absolute, relative to here or home, or under a folder that exists here."""
    if spec.startswith(("/", "./", "../", "~", ".\\")) or os.sep in spec and spec.count("/") > 1 or "\\" in spec:
        return True
    first = spec.split("/", 1)[0]
    return "/" in spec and Path(first).is_dir()


def _hub_id(spec: str) -> bool:
    """Whether `spec` can be a hub repository id, as huggingface_hub itself decides."""
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(spec)
    except ImportError:
        return True  # no way to tell: the loader decides
    except Exception:  # noqa: BLE001 - HFValidationError
        return False
    return not spec.startswith(".")


def model_path(spec: str) -> None:
    """MODEL: an existing directory, or a hub id in the local cache."""
    p = Path(spec).expanduser()
    if p.exists():
        _refuse_special(p, spec, "the model directory that holds config.json and the weights")
        if not p.is_dir():
            raise InputError(f"{spec} is a file; pass the model directory that holds config.json and the weights")
        return
    if _looks_like_path(spec) or not _hub_id(spec):
        raise _missing(spec, "model directory (and not a hub id)")
    if not _in_hub_cache(spec, "model"):
        raise InputError(f"{spec} is not a local directory and is not in the Hugging Face cache (no network is used)"
                         + _near_local(spec))


def dataset_path(spec: str) -> None:
    """DATASET: an existing file or folder, or a hub id (the hub's and datasets' caches: the loader)."""
    from dtype_doctor.load.dataset import DATA_FILE_BUILDERS

    p = Path(spec).expanduser()
    if p.exists():
        _refuse_special(p, spec, "a dataset file or folder")
        return
    hub_like = _hub_id(spec) and Path(spec).suffix.lower() not in DATA_FILE_BUILDERS
    if _looks_like_path(spec) or not hub_like:
        raise _missing(spec, "dataset file or folder")
    if not _in_hub_cache(spec, "dataset") and not _maybe_in_datasets_cache(spec):
        raise InputError(f"{spec} is not a local path and is not in the Hugging Face cache (no network is used)"
                         + _near_local(spec))


def user_file(flag: str, spec: str | None, *, function: bool = False) -> None:
    """--preprocess FILE.py:FUNC, --script FILE.py: the file exists and is a regular file."""
    if spec is None:
        return
    file = spec
    if function:
        from dtype_doctor.load.batch.preprocess import split_spec

        try:
            file = split_spec(spec)[0]
        except UsageError:
            raise UsageError(f"{flag} must be FILE.py:FUNC, not {spec!r}") from None
    p = Path(file).expanduser()
    if not p.exists():
        raise _missing(file, f"file ({flag})")
    _refuse_special(p, file, f"a Python file to {flag}")
    if p.is_dir():
        raise InputError(f"{flag} {file} is a folder; pass a Python file")


def readable_file(flag: str, path: Path | None) -> None:
    """A file an option reads (--baseline)."""
    if path is None:
        return
    if not path.exists():
        raise _missing(str(path), f"file ({flag})")
    _refuse_special(path, str(path), f"a file to {flag}")
    if path.is_dir():
        raise InputError(f"{flag} {path} is a folder; pass a file")


_WRITTEN = {"--output": "the report", "--plot": "the plot", "--write-baseline": "the baseline", "--write-patch": "the patch"}


def writable_file(flag: str, path: Path | str | None) -> None:
    """A file an option writes: not a folder, and not somewhere no file can go."""
    if path is None or str(path) == "-":
        return
    what = _WRITTEN.get(flag, f"{flag}'s file")
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"cannot write {what} to {path}: it is a folder; name a file ({flag})")
    for parent in p.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"cannot write {what} to {path}: {parent} is a file, not a folder ({flag})")
            break


def _in_hub_cache(spec: str, repo_type: str) -> bool:
    """Whether the hub's cache may hold `spec`: its folder there (`models--org--name`, as
    huggingface_hub lays the cache out) has snapshots. Read without importing huggingface_hub
    (a third of a second); True where the cache cannot be read, so the loader decides."""
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    root = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    if not os.path.isdir(root):
        return os.path.exists(root)  # no cache at all: nothing is in it; something else there: let the loader say
    folder = os.path.join(root, f"{repo_type}s--{spec.replace('/', '--')}", "snapshots")
    try:
        return any(os.scandir(folder))
    except OSError:
        return False


def _maybe_in_datasets_cache(spec: str) -> bool:
    """Whether `datasets`' own cache may hold `spec` (a dataset it prepared: `org___name`), read
    without importing datasets; True where the cache cannot be read, so the loader decides."""
    root = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "datasets")
    try:
        names = {e.name.lower() for e in os.scandir(root)}
    except OSError:
        return True
    return spec.replace("/", "___").lower() in names


def _near_local(spec: str) -> str:
    """`; did you mean './x'?` when a folder here is near the given name."""
    try:
        names = [e.name for e in os.scandir(".") if e.is_dir()]
    except OSError:
        return ""
    near = difflib.get_close_matches(spec, names, n=1, cutoff=0.75)
    return f"; did you mean {near[0]!r}?" if near else ""
