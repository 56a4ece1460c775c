"""``Dataset.map`` as the pipeline runs it, quietly: in memory, no cache files, no progress bar."""

from __future__ import annotations

import sys
from typing import Any, Callable

from dtype_doctor.errors import InputError, first_line


def quiet_map(ds: Any, fn: Callable[..., Any], *, batched: bool, tag: str, fn_kwargs: dict[str, Any] | None = None) -> Any:
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    old_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # a user function importing its neighbours writes no __pycache__
    try:
        return ds.map(
            fn,
            batched=batched,
            fn_kwargs=fn_kwargs or {},
            keep_in_memory=True,
            load_from_cache_file=False,
            new_fingerprint=f"dtype-doctor-{tag}-{ds._fingerprint}",
            desc=None,
        )
    finally:
        sys.dont_write_bytecode = old_bytecode
        if was:
            datasets.enable_progress_bars()


def map_processor(ds: Any, fn: Callable[..., Any], tag: str, what: str) -> Any:
    """A processor applied as a batched map; its failure is one InputError naming `what`."""
    try:
        return quiet_map(ds, fn, batched=True, tag=tag)
    except Exception as e:  # noqa: BLE001 - the processor's own error, in one line
        raise InputError(f"{what}: {type(e).__name__}: {first_line(e)}") from None
