"""Memory, estimated before it is spent.

A model's weights are counted before any is read: from the safetensors headers (shapes and
dtypes, no data) and from config.json (the model built on the meta device, which allocates
nothing). The larger count, in the dtype the load will give, is compared with the memory the
machine has available (and the address-space limit, RLIMIT_AS, when one is set): a model that
cannot fit is refused with the `--simulate` hint instead of being materialised until the
machine stops it. Dataset rows are bounded too (MAX_ROW_BYTES), checked as they are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError
from dtype_doctor.machine.host import available, gib  # noqa: F401 - gib: the loaders' messages

MAX_ROW_BYTES = 64 * 2**20  # one dataset row, as stored (JSON line, CSV line, Arrow or Parquet bytes)
MAX_BATCH_SIZE = 4096  # rows traced: a dtype trace needs a batch, not an epoch

_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_FLOATS = {"F64", "F32", "F16", "BF16"}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class WeightEstimate:
    """What loading the weights costs, before any is read."""

    parameters: int  # elements the model holds (the larger of checkpoint and config counts)
    bytes: int  # those elements in the dtype the load gives them
    mapped: int  # bytes of the safetensors files the load maps into the address space
    dtype: str  # the dtype the count assumes for floating weights


def header_elements(files: list[Path]) -> tuple[int, int, str | None]:
    """(elements, bytes as stored, the first floating dtype) from the safetensors headers only."""
    from safetensors import safe_open

    elements = stored = 0
    first_float = None
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                sl = st.get_slice(key)
                n = 1
                for d in sl.get_shape():
                    n *= int(d)
                dt = sl.get_dtype()
                elements += n
                stored += n * _ITEMSIZE.get(dt, 4)
                if first_float is None and dt in _FLOATS:
                    first_float = dt
    return elements, stored, first_float


def config_elements(cls: Any, config: Any) -> int:
    """Elements of the model config.json describes, built on the meta device (no memory spent)."""
    import torch

    try:
        with torch.device("meta"):
            model = cls._from_config(config)
    except Exception:  # noqa: BLE001 - a class that cannot be built on meta: the headers decide
        return 0
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def estimate(files: list[Path], cls: Any, config: Any, dtype: str, header_dtype: str | None) -> WeightEstimate:
    """The cost of `from_pretrained(dtype=dtype)`: floating weights in `dtype` (for "auto", the
    checkpoint's, else config.json's, else float32), the rest as stored."""
    elements, stored, _ = header_elements(files) if files else (0, 0, None)
    if dtype == "auto":
        cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype = header_dtype or (str(cfg).removeprefix("torch.") if cfg else "float32")
    per = _DTYPE_BYTES.get(dtype, 4)
    meta = config_elements(cls, config) if cls is not None else 0
    parameters = max(elements, meta)
    as_loaded = max(stored if dtype == "auto" else elements * per, meta * per)
    return WeightEstimate(parameters, as_loaded, sum(f.stat().st_size for f in files), dtype)


def check_fits(model_dir: Path, est: WeightEstimate, device: str) -> None:
    """InputError, with the --simulate hint, when the weights cannot fit where they are loaded."""
    hint = "pass --simulate to check it without loading any weight"
    need = est.bytes
    avail, what = available()
    if "RLIMIT_AS" in what:
        need += est.mapped  # the safetensors files are mapped into the address space as well
    if need > avail:
        raise InputError(
            f"{model_dir} needs about {gib(need)} to load ({est.parameters:,} weights as {est.dtype}) and this "
            f"machine has {gib(avail)} of {what}; {hint}"
        )
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _total = torch.cuda.mem_get_info(torch.device(device))
            if est.bytes > free:
                raise InputError(f"{model_dir} needs about {gib(est.bytes)} on {device}, which has {gib(free)} free; {hint}")


def check_row_lines(f: Path, rows: int, header: bool = False) -> None:
    """A text data file (JSON lines, CSV, text): the first `rows` lines are each at most
    MAX_ROW_BYTES, read in chunks, before any is parsed. Empty files are named as empty."""
    want = rows + (1 if header else 0)
    chunk = 1 << 20
    if f.stat().st_size <= chunk and not f.read_bytes().strip():
        raise InputError(f"{f} is empty: it holds no rows")
    seen = size = 0
    with f.open("rb") as fh:
        while seen < want:
            block = fh.read(chunk)
            if not block:
                break
            start = 0
            while True:
                nl = block.find(b"\n", start)
                piece = block[start:] if nl < 0 else block[start:nl]
                size += len(piece)
                if size > MAX_ROW_BYTES:
                    raise InputError(
                        f"{f}: line {seen + 1} holds more than {gib(MAX_ROW_BYTES)} (the limit on one row); "
                        "a traced batch needs a few ordinary rows"
                    )
                if nl < 0:
                    break
                seen, size, start = seen + 1, 0, nl + 1
                if seen >= want:
                    break


def check_row_bytes(where: str, nbytes: int, rows: int) -> None:
    """Rows read from Arrow or Parquet: their bytes as stored, before they become Python objects."""
    if rows and nbytes / rows > MAX_ROW_BYTES:
        raise InputError(
            f"{where}: its rows hold about {gib(nbytes / rows)} each, more than the {gib(MAX_ROW_BYTES)} limit on one "
            "row; a traced batch needs a few ordinary rows"
        )
