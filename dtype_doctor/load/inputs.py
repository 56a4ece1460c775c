"""Moved to the `dtype_doctor.load.batch` package (one module per stage); kept so that
``from dtype_doctor.load.inputs import …`` goes on working."""

from dtype_doctor.load.batch import COLLATORS, DATASET_FORMATS, PREPROCESS_MODES, Batch, PreprocessFn, build_batch
from dtype_doctor.load.batch.preprocess import load_preprocess
from dtype_doctor.load.batch.source_lines import source_lines

__all__ = [
    "Batch", "PreprocessFn", "build_batch", "load_preprocess", "source_lines",
    "PREPROCESS_MODES", "DATASET_FORMATS", "COLLATORS",
]
