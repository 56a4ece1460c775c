"""LOAD stage: the model (real or simulated with fake tensors), the first rows of the dataset,
and the batch a Hugging Face pipeline would build from them, with each input's dtype lineage.

    loaded = load_model("path/to/model", dtype="auto", placement=decide("cpu"))
    rows = load_rows("path/to/data.parquet", split=None, n=2)
    batch = build_batch(loaded, rows, preprocess="prep.py:preprocess")
    loaded.model(**batch.inputs)

Importing this package imports neither torch, transformers nor datasets; the functions do.
"""

from __future__ import annotations

from dtype_doctor.load.dataset import LoadedRows, load_rows
from dtype_doctor.load.batch import Batch, PreprocessFn, build_batch, load_preprocess
from dtype_doctor.load.model import MODEL_DTYPES, LoadedModel, load_model, resolve_model_dir

__all__ = [
    "Batch",
    "LoadedModel",
    "LoadedRows",
    "MODEL_DTYPES",
    "PreprocessFn",
    "build_batch",
    "load_model",
    "load_preprocess",
    "load_rows",
    "resolve_model_dir",
]
