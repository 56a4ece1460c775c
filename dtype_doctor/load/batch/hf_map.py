"""``Dataset.map`` as the pipeline runs it, quietly: in memory, no cache files, no progress bar."""

from __future__ import annotations

from typing import Any, Callable

from dtype_doctor.records.errors import InputError, first_line


def quiet_map(ds: Any, fn: Callable[..., Any], *, batched: bool, tag: str) -> Any:
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return ds.map(
            fn,
            batched=batched,
            keep_in_memory=True,
            load_from_cache_file=False,
            new_fingerprint=f"dtype-doctor-{tag}-{ds._fingerprint}",
            desc=None,
        )
    finally:
        if was:
            datasets.enable_progress_bars()


def map_processor(ds: Any, fn: Callable[..., Any], tag: str, what: str) -> Any:
    """A processor applied as a batched map; its failure is one InputError naming `what`."""
    try:
        return quiet_map(ds, fn, batched=True, tag=tag)
    except Exception as e:  # noqa: BLE001 - the processor's own error, in one line
        raise InputError(f"{what}: {type(e).__name__}: {first_line(e)}") from None
