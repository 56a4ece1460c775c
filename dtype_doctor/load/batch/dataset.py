"""The dataset stage: each column's dtype as the dataset stores it."""

from __future__ import annotations

from dtype_doctor.load.batch.describe import feature_dtype
from dtype_doctor.load.batch.state import BatchContext, BatchState
from dtype_doctor.records import LineageStep


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    for col, feat in state.dataset.features.items():
        dt, detail = feature_dtype(feat)
        state = state.step(col, LineageStep("dataset", dt, None, None, f"column '{col}': {detail}"))
    return state
