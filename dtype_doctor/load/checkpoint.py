"""The dtypes a checkpoint holds, read without loading its tensors: a safetensors file's header (or
each shard's, for a folder), a torch checkpoint loaded with `weights_only=True` onto the meta device
from a memory map (no tensor data is read), a DCP folder's `.metadata`."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

from dtype_doctor.records.errors import InputError
from dtype_doctor.records.resume import SavedCheckpoint

# safetensors' dtype codes (the format's specification) → torch's names.
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64"}
# Where a torch checkpoint keeps the model's weights, by the keys training scripts use.
MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module", "net")
# Name segments a wrapper adds to a saved weight's name (torch.compile, DDP, FSDP2/DCP's app state).
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "model.")


def saved_dtypes(path: str) -> SavedCheckpoint:
    p = Path(path)
    if not p.exists():
        raise InputError(f"--checkpoint {path}: no such file or directory")
    if p.is_dir():
        if (p / ".metadata").is_file():
            return SavedCheckpoint(path, "dcp", tuple(_dcp(p)))
        shards = sorted(p.glob("*.safetensors"))
        if shards:
            return SavedCheckpoint(path, "safetensors", tuple(t for s in shards for t in _safetensors(s)))
        raise InputError(f"--checkpoint {path}: a folder with neither *.safetensors files nor a DCP .metadata")
    if p.suffix == ".safetensors":
        return SavedCheckpoint(path, "safetensors", tuple(_safetensors(p)))
    return SavedCheckpoint(path, "torch", tuple(_torch(p)))


def _safetensors(path: Path) -> Iterator[tuple[str, str]]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InputError(f"--checkpoint {path}: not a safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(size))
        except (ValueError, MemoryError) as exc:
            raise InputError(f"--checkpoint {path}: not a safetensors file ({exc})") from exc
    for name, entry in header.items():
        if name != "__metadata__" and isinstance(entry, dict):
            yield name, SAFETENSORS_DTYPES.get(entry.get("dtype", ""), str(entry.get("dtype")).lower())


def _torch(path: Path) -> Iterator[tuple[str, str]]:
    import pickle

    import torch

    from dtype_doctor.numerics import dtype_name

    try:
        data = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--checkpoint {path}: torch.load(weights_only=True) refused it: {first}") from exc
    model = next((data[k] for k in MODEL_KEYS if isinstance(data, dict) and isinstance(data.get(k), dict)), data)
    for name, t in _tensors(model):
        yield name, dtype_name(t.dtype)
    optimizer = data.get("optimizer") if isinstance(data, dict) else None
    for name, t in _tensors(optimizer.get("state", {}) if isinstance(optimizer, dict) else {}):
        yield f"optimizer.{name}", dtype_name(t.dtype)


def _tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix.rstrip("."), obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}{k}.")


def _dcp(path: Path) -> Iterator[tuple[str, str]]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from dtype_doctor.numerics import dtype_name

    metadata = FileSystemReader(str(path)).read_metadata()
    for name, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            yield name, dtype_name(entry.properties.dtype)


def matched(saved: SavedCheckpoint, names: list[str]) -> dict[str, str]:
    """Model state name → the saved dtype of the tensor saved for it (wrapper prefixes set aside)."""
    by_name: dict[str, str] = {}
    for name, dtype in saved.tensors:
        if name.startswith("optimizer."):
            continue
        by_name.setdefault(name, dtype)
        bare = name
        while bare.startswith(WRAPPER_PREFIXES):
            bare = bare.split(".", 1)[1]
            by_name.setdefault(bare, dtype)
    return {n: by_name[n] for n in names if n in by_name}
