"""Read the first rows of a dataset, whatever its size, without writing anywhere.

Data files (csv, tsv, json, jsonl, parquet, arrow, txt) and image folders are read through
``datasets.load_dataset(..., streaming=True)`` and ``.take(n)``, so a file of millions of rows
costs what its first record batch costs. ``save_to_disk`` directories are memory-mapped with
``load_from_disk`` and sliced. Either way the rows come back as a small in-memory
``datasets.Dataset`` with the original ``features``: ``.map`` and ``.with_format`` behave as on
the user's dataset and write no cache file next to the user's data.
"""

from __future__ import annotations

import hashlib

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dtype_doctor.records.errors import InputError, UsageError, first_line as _first_line
from dtype_doctor.load.memory import check_row_bytes, check_row_lines

__all__ = ["LoadedRows", "load_rows", "DATA_FILE_BUILDERS"]

DATA_FILE_BUILDERS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".arrow": "arrow",
    ".txt": "text",
}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class LoadedRows:
    """The first rows of one split, as a small in-memory ``datasets.Dataset``."""

    dataset: Any  # datasets.Dataset holding num_rows_read rows, with the original features
    features: Any  # datasets.Features
    split: str
    path: str  # the resolved path (or hub id) that was read
    num_rows_read: int
    splits: tuple[str, ...]  # the splits the dataset offers
    # extras beyond the brief
    reader: str = "streaming"  # streaming | load_from_disk | cache
    builder: str | None = None  # parquet, csv, json, arrow, imagefolder … (None for save_to_disk)
    spec: str = ""  # the DATASET argument as given


@contextmanager
def offline() -> Iterator[None]:
    """Hub offline mode for the duration: `datasets` reads what is cached and never the network,
    whether or not HF_HUB_OFFLINE is set in the environment."""
    import datasets.config as dcfg
    import huggingface_hub.constants as hcst

    saved = (hcst.HF_HUB_OFFLINE, dcfg.HF_HUB_OFFLINE, getattr(dcfg, "HF_DATASETS_OFFLINE", None))
    hcst.HF_HUB_OFFLINE = True
    dcfg.HF_HUB_OFFLINE = True
    if saved[2] is not None:
        dcfg.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        hcst.HF_HUB_OFFLINE, dcfg.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is not None:
            dcfg.HF_DATASETS_OFFLINE = saved[2]


def _pick_split(available: list[str], split: str | None, where: str) -> str:
    if not available:
        raise InputError(f"{where} has no splits; it holds no data")
    if split is None:
        return "train" if "train" in available else available[0]
    if split not in available:
        raise InputError(
            f"{where} has no split {split!r}; available splits: {', '.join(available)} (pass --split NAME)"
        )
    return split


def _is_save_to_disk(d: Path) -> bool:
    return (d / "dataset_dict.json").is_file() or (
        (d / "state.json").is_file() and (d / "dataset_info.json").is_file()
    )


def _data_file_kinds(d: Path) -> set[str]:
    kinds: set[str] = set()
    for f in d.rglob("*"):
        if any(part.startswith(".") for part in f.relative_to(d).parts):
            continue
        if not f.is_file():
            continue
        suf = f.suffix.lower()
        if suf in DATA_FILE_BUILDERS:
            kinds.add(DATA_FILE_BUILDERS[suf])
        elif suf in _IMAGE_SUFFIXES:
            kinds.add("imagefolder")
        elif suf in _AUDIO_SUFFIXES:
            kinds.add("audiofolder")
        if len(kinds) > 1:
            break
    return kinds


def _rows_from_iterable(it: Any, n: int) -> tuple[list[dict[str, Any]], Any]:
    """The first n rows of an IterableDataset, undecoded (image/audio as path/bytes), and features."""
    # decode(False) keeps image / audio cells as {path, bytes}: no decoding, no re-encoding
    src = it.decode(False) if it.features is not None and hasattr(it, "decode") else it
    rows = list(src.take(n))
    features = it.features
    return rows, features


def _in_memory(rows: list[dict[str, Any]], features: Any) -> Any:
    from datasets import Dataset

    if features is not None:
        try:
            return Dataset.from_list(rows, features=features)
        except Exception:
            pass  # e.g. a feature whose stored form the rows do not match: infer instead
    return Dataset.from_list(rows)


def _load_streaming(
    spec: str, where: str, split: str | None, n: int, *, builder: str | None, data_files: Any = None,
    path_arg: str | None = None, **kw: Any,
) -> LoadedRows:
    import datasets

    try:
        with offline():
            if builder is not None:
                dd = datasets.load_dataset(builder, data_files=data_files, streaming=True, **kw)
            else:
                dd = datasets.load_dataset(path_arg, streaming=True, **kw)
    except Exception as e:
        raise InputError(
            f"{where} could not be read{f' as {builder}' if builder else ''}: {type(e).__name__}: {_first_line(e)}"
        ) from None
    if isinstance(dd, datasets.IterableDatasetDict):
        available = list(dd.keys())
        chosen = _pick_split(available, split, where)
        it = dd[chosen]
    else:  # pragma: no cover - load_dataset without split returns a dict
        available, chosen, it = ["train"], _pick_split(["train"], split, where), dd
    try:
        with offline():
            rows, features = _rows_from_iterable(it, n)
    except Exception as e:
        raise InputError(f"{where} could not be read: {type(e).__name__}: {_first_line(e)}") from None
    if not rows:
        raise InputError(f"{where} split {chosen!r} has no rows")
    ds = _in_memory(rows, features)
    info_builder = builder or getattr(getattr(it, "info", None), "builder_name", None)
    return LoadedRows(
        dataset=ds,
        features=ds.features,
        split=chosen,
        path=where,
        num_rows_read=len(rows),
        splits=tuple(available),
        reader="streaming",
        builder=info_builder,
        spec=spec,
    )


def _slice_in_memory(ds: Any, n: int, where: str = "the dataset") -> Any:
    """The first n rows of a (memory-mapped) Dataset as an in-memory Dataset, nothing decoded;
    rows over MAX_ROW_BYTES refused while they are still mapped, not copied."""
    from datasets import Dataset
    from datasets.table import InMemoryTable

    k = min(n, len(ds))
    table = ds.select(range(k)).with_format("arrow")[:k]
    check_row_bytes(where, table.nbytes, k)
    table = table.combine_chunks() if hasattr(table, "combine_chunks") else table
    # A fingerprint of our own: without one datasets hashes the whole table by pickling it,
    # which costs a pass over the rows and fails on Python 3.12 with pyarrow 26 ("Can't pickle
    # <class 'MonthDayNano'>", seen on a GPU machine's Python 3.12).
    fingerprint = hashlib.sha256(f"{getattr(ds, '_fingerprint', None)}:{k}".encode()).hexdigest()[:16]  # datasets allows 64 characters
    return Dataset(InMemoryTable(table), info=ds.info.copy(), split=ds.split, fingerprint=fingerprint)


def _saved_without_data(d: Path) -> bool:
    """A Dataset saved with no rows has no .arrow file, and load_from_disk fails on it."""
    try:
        state = json.loads((d / "state.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(state, dict) and state.get("_data_files") == []


def _load_from_disk(spec: str, d: Path, split: str | None, n: int) -> LoadedRows:
    import datasets

    dict_file = d / "dataset_dict.json"
    if dict_file.is_file():
        # a DatasetDict: read the split list, then load only the chosen split
        try:
            available = [str(x) for x in json.loads(dict_file.read_text(encoding="utf-8"))["splits"]]
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{dict_file} is not a valid dataset_dict.json: {_first_line(e)}") from None
        chosen = _pick_split(available, split, str(d))
        sub = d / chosen
        if _saved_without_data(sub):
            raise InputError(f"{d} split {chosen!r} has no rows")
        try:
            ds = datasets.load_from_disk(str(sub))
        except Exception as e:
            raise InputError(
                f"{sub} looks like a save_to_disk split but could not be loaded: {type(e).__name__}: {_first_line(e)}"
            ) from None
        return _disk_rows(spec, d, ds, chosen, available, n)
    if _saved_without_data(d):
        _pick_split(["train"], split, str(d))
        raise InputError(f"{d} split {split or 'train'!r} has no rows")
    try:
        obj = datasets.load_from_disk(str(d))
    except Exception as e:
        raise InputError(
            f"{d} looks like a save_to_disk directory but could not be loaded: {type(e).__name__}: {_first_line(e)}"
        ) from None
    if isinstance(obj, datasets.DatasetDict):
        available = list(obj.keys())
        chosen = _pick_split(available, split, str(d))
        ds = obj[chosen]
    else:
        own = str(obj.split) if obj.split is not None else "train"
        available = [own]
        chosen = _pick_split(available, split, str(d)) if split is not None else own
        ds = obj
    return _disk_rows(spec, d, ds, chosen, available, n)


def _disk_rows(spec: str, d: Path, ds: Any, chosen: str, available: list[str], n: int) -> LoadedRows:
    if len(ds) == 0:
        raise InputError(f"{d} split {chosen!r} has no rows")
    small = _slice_in_memory(ds, n, str(d))
    return LoadedRows(
        dataset=small,
        features=small.features,
        split=chosen,
        path=str(d),
        num_rows_read=len(small),
        splits=tuple(available),
        reader="load_from_disk",
        builder=None,
        spec=spec,
    )


def _load_file(spec: str, f: Path, split: str | None, n: int) -> LoadedRows:
    suf = f.suffix.lower()
    builder = DATA_FILE_BUILDERS.get(suf)
    if builder is None:
        raise InputError(
            f"{f} is not a dataset file this tool reads; use csv, tsv, json, jsonl, parquet, arrow or txt, "
            "a save_to_disk directory or an image folder"
        )
    kw: dict[str, Any] = {}
    if suf == ".tsv":
        kw["sep"] = "\t"
    if suf == ".json":
        _check_json_file(f)
    if builder in ("json", "csv", "text"):
        check_row_lines(f, n, header=builder == "csv")
    elif builder == "parquet":
        _check_parquet_rows(f)
    return _load_streaming(spec, str(f), split, n, builder=builder, data_files={"train": str(f)}, **kw)


def _check_parquet_rows(f: Path) -> None:
    """The first row group's uncompressed bytes per row, from the footer: a few compressed bytes
    can hold a list of a hundred million elements."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(str(f)).metadata
    except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid, OSError
        raise InputError(f"{f} could not be read as parquet: {type(e).__name__}: {_first_line(e)}") from None
    if meta.num_row_groups == 0 or meta.num_rows == 0:
        return  # the reader says the split has no rows
    group = meta.row_group(0)
    widths = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
    decoded = 0  # dictionary and run-length encodings hide how many values a column holds: count them
    for i in range(group.num_columns):
        col = group.column(i)
        decoded += max(col.total_uncompressed_size, col.num_values * widths.get(col.physical_type, 1))
    check_row_bytes(str(f), decoded, group.num_rows)


def _check_json_file(f: Path) -> None:
    """A .json holding one object (columns, or records under a key) would load as a single row."""
    try:
        if f.stat().st_size > 64 * 2**20:
            return  # too big to parse whole here; the json builder reads it
        with f.open("rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError as e:
        raise InputError(f"{f} cannot be read: {_first_line(e)}") from None
    if not head.startswith(b"{"):
        return
    try:
        obj = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # JSON lines: the builder reads them
    if not isinstance(obj, dict) or not obj:
        return
    nested = [k for k, v in obj.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
    if nested:
        raise InputError(
            f"{f} is one JSON object with its records under {nested[0]!r}; write the records as JSON lines "
            "or as a top-level list"
        )
    if all(isinstance(v, list) for v in obj.values()) and len({len(v) for v in obj.values()}) == 1 and len(
        next(iter(obj.values()))
    ) > 1:
        raise InputError(
            f"{f} is one JSON object of columns ({', '.join(list(obj)[:5])}); write it as JSON lines "
            "(Dataset.to_json) or as a list of records"
        )


def _load_dir(spec: str, d: Path, split: str | None, n: int) -> LoadedRows:
    if _is_save_to_disk(d):
        return _load_from_disk(spec, d, split, n)
    kinds = _data_file_kinds(d)
    if not kinds:
        raise InputError(
            f"{d} holds no dataset: no save_to_disk files (dataset_info.json, state.json) and no csv, json, "
            "jsonl, parquet, arrow or image files"
        )
    return _load_streaming(spec, str(d), split, n, builder=None, path_arg=str(d))


def _load_hub(spec: str, split: str | None, n: int) -> LoadedRows:
    snap: str | None = None
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(spec, repo_type="dataset", local_files_only=True)
    except Exception:
        snap = None
    if snap and Path(snap).is_dir():
        rows = _load_dir(spec, Path(snap), split, n)
        return LoadedRows(
            dataset=rows.dataset, features=rows.features, split=rows.split, path=spec,
            num_rows_read=rows.num_rows_read, splits=rows.splits, reader=rows.reader,
            builder=rows.builder, spec=spec,
        )
    # a dataset `datasets` itself prepared earlier (its Arrow cache), loaded offline, memory-mapped
    import datasets
    from datasets.utils import logging as ds_logging

    try:
        verbosity = ds_logging.get_verbosity()
        ds_logging.set_verbosity_error()
        try:
            with offline():
                obj = datasets.load_dataset(spec, download_mode="reuse_dataset_if_exists")
        finally:
            ds_logging.set_verbosity(verbosity)
    except Exception:
        obj = None
    if obj is None:
        raise InputError(
            f"{spec} is not a local path and is not in the Hugging Face cache (no network is used)"
        )
    available = list(obj.keys())
    chosen = _pick_split(available, split, spec)
    ds = obj[chosen]
    if len(ds) == 0:
        raise InputError(f"{spec} split {chosen!r} has no rows")
    small = _slice_in_memory(ds, n, spec)
    return LoadedRows(
        dataset=small, features=small.features, split=chosen, path=spec, num_rows_read=len(small),
        splits=tuple(available), reader="cache", builder=None, spec=spec,
    )


def load_rows(spec: str, *, split: str | None = None, n: int = 2) -> LoadedRows:
    """Read the first `n` rows of `split` (default "train", else the first split) of `spec`.

    `spec` is a ``save_to_disk`` directory, a data file or a directory of them, an image folder,
    or a hub id already in the local Hugging Face cache. Raises ``UsageError`` for ``n < 1`` and
    ``InputError`` for a dataset that is missing, unreadable, empty or lacks the split.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError(f"batch size must be a whole number of at least 1, got {n!r}")
    p = Path(spec).expanduser()
    if p.exists():
        p = p.resolve()
        if p.is_dir():
            return _load_dir(spec, p, split, n)
        return _load_file(spec, p, split, n)
    if _HUB_ID.match(spec) and not spec.startswith(".") and Path(spec).suffix.lower() not in DATA_FILE_BUILDERS:
        return _load_hub(spec, split, n)
    raise InputError(
        f"{spec} is not a local path and is not in the Hugging Face cache (no network is used)"
    )
