"""What a modality's processor module provides to the processor stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from dtype_doctor.records.errors import InputError
from dtype_doctor.load.batch.describe import feature_dtype
from dtype_doctor.load.batch.state import BatchContext, BatchState
from dtype_doctor.records import LineageStep


@dataclass(frozen=True)
class Modality:
    """One kind of raw column and the processor call that turns it into model inputs."""

    name: str
    applies: Callable[[BatchState, BatchContext], bool]
    run: Callable[[BatchState, BatchContext], BatchState]


def require(obj: Any, column: str, holds: str, loaded: Any, what: str, files: str) -> Any:
    if obj is None:
        raise InputError(
            f"dataset column '{column}' {holds} but {loaded.path} has no {what} ({files}); "
            "add one or pass --preprocess FILE.py:FUNC"
        )
    return obj


def record_outputs(state: BatchState, new_ds: Any, made: dict[str, str], detail: Callable[[str, str | None], str]) -> BatchState:
    """The processor's output columns `made` (output → the raw column it came from), each with
    the lineage of its raw column and one processor step; `new_ds` becomes the state's dataset."""
    lineage = state.lineage
    for out, src in made.items():
        if out != src:
            lineage = lineage.copy(src, out)
    state = state.but(dataset=new_ds, lineage=lineage, made_by_processor=state.made_by_processor | set(made))
    for out in made:
        dt, _ = feature_dtype(new_ds.features[out])
        state = state.step(out, LineageStep("processor", dt, None, None, detail(out, dt)))
    return state
