"""load_rows: every supported format, only the first n rows read, splits, and bad input."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, List, Value

from dtype_doctor.records.errors import InputError, UsageError
from dtype_doctor.load import LoadedRows, load_rows

pytestmark = pytest.mark.filterwarnings("ignore")

FEATURES = Features({"text": Value("string"), "label": Value("int32"), "x": List(Value("float16"))})


def small() -> Dataset:
    return Dataset.from_dict(
        {"text": ["a b", "c d e", "f", "g h"], "label": [0, 1, 0, 1], "x": [[1.0, 2.0]] * 4},
        features=FEATURES,
    )


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    datasets.disable_progress_bars()
    root = tmp_path_factory.mktemp("data")
    ds = small()
    out: dict[str, Path] = {}
    out["parquet"] = root / "a.parquet"
    ds.to_parquet(str(out["parquet"]))
    out["csv"] = root / "a.csv"
    ds.remove_columns("x").to_csv(str(out["csv"]), index=False)
    out["tsv"] = root / "a.tsv"
    out["tsv"].write_text("text\tlabel\na b\t0\nc\t1\nd\t0\n")
    out["jsonl"] = root / "a.jsonl"
    ds.to_json(str(out["jsonl"]))
    out["json"] = root / "records.json"
    out["json"].write_text(json.dumps([{"text": "a", "label": 0}, {"text": "b", "label": 1}, {"text": "c", "label": 2}]))
    out["arrow"] = root / "a.arrow"
    with pa.OSFile(str(out["arrow"]), "wb") as sink:
        table = ds.data.table
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    out["disk"] = root / "disk"
    ds.save_to_disk(str(out["disk"]))
    out["diskdict"] = root / "diskdict"
    DatasetDict({"validation": ds.select([0, 1, 2]), "test": ds.select([3])}).save_to_disk(str(out["diskdict"]))
    out["splitdir"] = root / "splitdir"
    out["splitdir"].mkdir()
    ds.to_parquet(str(out["splitdir"] / "train.parquet"))
    ds.select([0]).to_parquet(str(out["splitdir"] / "test.parquet"))
    out["images"] = root / "images"
    from PIL import Image as PILImage

    for cls in ("circle", "square"):
        (out["images"] / cls).mkdir(parents=True)
        for i in range(3):
            PILImage.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(out["images"] / cls / f"{i}.png")
    # 200,000 rows: reading two of them must cost what reading two of a tiny file costs
    out["big"] = root / "big.parquet"
    n = 200_000
    pq.write_table(
        pa.table({"text": pa.array(["row %d" % i for i in range(n)]), "label": pa.array(np.arange(n) % 3, pa.int32())}),
        str(out["big"]),
    )
    out["bigdisk"] = root / "bigdisk"
    Dataset(pa.table({"label": pa.array(np.arange(n), pa.int64())})).save_to_disk(str(out["bigdisk"]))
    return out


@pytest.mark.parametrize(
    "kind,reader,builder,features",
    [
        ("parquet", "streaming", "parquet", FEATURES),
        ("arrow", "streaming", "arrow", FEATURES),
        ("jsonl", "streaming", "json", Features({"text": Value("string"), "label": Value("int64"), "x": List(Value("float64"))})),
        ("json", "streaming", "json", Features({"text": Value("string"), "label": Value("int64")})),
        ("csv", "streaming", "csv", Features({"text": Value("string"), "label": Value("int64")})),
        ("tsv", "streaming", "csv", Features({"text": Value("string"), "label": Value("int64")})),
        ("disk", "load_from_disk", None, FEATURES),
    ],
)
def test_formats(data: dict[str, Path], kind: str, reader: str, builder: str | None, features: Features) -> None:
    rows = load_rows(str(data[kind]))
    assert isinstance(rows, LoadedRows)
    assert rows.reader == reader and rows.builder == builder
    assert rows.split == "train" and rows.splits == ("train",)
    assert rows.num_rows_read == 2 and len(rows.dataset) == 2
    assert rows.features == features == rows.dataset.features
    assert isinstance(rows.dataset, Dataset)
    assert rows.dataset.cache_files == []  # in memory: map() writes nothing next to the user's data
    assert rows.dataset[0]["text"] in ("a b", "a")


def test_rows_keep_features_for_map_and_formatters(data: dict[str, Path]) -> None:
    import torch

    ds = load_rows(str(data["parquet"])).dataset
    mapped = ds.map(lambda e: {"y": e["label"] * 2})
    assert mapped.features["label"] == Value("int32")
    t = ds.with_format("torch")[0]
    assert t["label"].dtype == torch.int64 and t["x"].dtype == torch.float32  # TorchFormatter's casts


def test_imagefolder_with_class_labels(data: dict[str, Path]) -> None:
    rows = load_rows(str(data["images"]), n=3)
    assert rows.reader == "streaming" and rows.builder == "imagefolder"
    assert isinstance(rows.features["image"], Image)
    assert rows.features["label"] == ClassLabel(names=["circle", "square"])
    img = rows.dataset[0]["image"]
    assert img.size == (8, 8) and img.mode == "RGB"
    assert rows.num_rows_read == 3


def test_only_the_first_rows_are_read(data: dict[str, Path]) -> None:
    load_rows(str(data["parquet"]))  # warm up the parquet builder's imports
    t0 = time.perf_counter()
    rows = load_rows(str(data["big"]))
    elapsed = time.perf_counter() - t0
    assert rows.reader == "streaming" and rows.num_rows_read == 2 and len(rows.dataset) == 2
    assert rows.dataset["text"] == ["row 0", "row 1"]
    assert rows.features["label"] == Value("int32")
    assert elapsed < 3.0, elapsed
    t0 = time.perf_counter()
    rows = load_rows(str(data["bigdisk"]), n=5)
    assert time.perf_counter() - t0 < 3.0
    assert rows.reader == "load_from_disk" and rows.dataset["label"] == [0, 1, 2, 3, 4]


def test_n_larger_than_the_dataset_reads_all_rows(data: dict[str, Path]) -> None:
    assert load_rows(str(data["parquet"]), n=100).num_rows_read == 4
    assert load_rows(str(data["disk"]), n=100).num_rows_read == 4


def test_splits(data: dict[str, Path]) -> None:
    rows = load_rows(str(data["diskdict"]))  # no "train": the first split
    assert rows.split == "validation" and rows.splits == ("validation", "test")
    assert load_rows(str(data["diskdict"]), split="test").num_rows_read == 1
    rows = load_rows(str(data["splitdir"]))
    assert rows.split == "train" and set(rows.splits) == {"train", "test"} and rows.reader == "streaming"
    assert load_rows(str(data["splitdir"]), split="test").num_rows_read == 1
    with pytest.raises(InputError) as e:
        load_rows(str(data["diskdict"]), split="train")
    assert str(e.value) == (
        f"{data['diskdict']} has no split 'train'; available splits: validation, test (pass --split NAME)"
    )
    with pytest.raises(InputError) as e:
        load_rows(str(data["parquet"]), split="test")
    assert str(e.value) == f"{data['parquet']} has no split 'test'; available splits: train (pass --split NAME)"
    with pytest.raises(InputError) as e:
        load_rows(str(data["disk"]), split="test")
    assert str(e.value) == f"{data['disk']} has no split 'test'; available splits: train (pass --split NAME)"


@pytest.mark.parametrize("n", [0, -1, True])
def test_batch_size_below_one(data: dict[str, Path], n: int) -> None:
    with pytest.raises(UsageError) as e:
        load_rows(str(data["parquet"]), n=n)
    assert str(e.value) == f"batch size must be a whole number of at least 1, got {n!r}"


def test_missing_path(tmp_path: Path) -> None:
    for spec in (str(tmp_path / "nope.parquet"), str(tmp_path / "nope"), "no-such-org/no-such-dataset-xyz"):
        with pytest.raises(InputError) as e:
            load_rows(spec)
        assert str(e.value) == f"{spec} is not a local path and is not in the Hugging Face cache (no network is used)"


def test_empty_datasets(tmp_path: Path) -> None:
    empty = Dataset.from_dict({"text": [], "label": []}, features=Features({"text": Value("string"), "label": Value("int64")}))
    f = tmp_path / "empty.parquet"
    empty.to_parquet(str(f))
    with pytest.raises(InputError) as e:
        load_rows(str(f))
    assert str(e.value) == f"{f} split 'train' has no rows"
    d = tmp_path / "empty-disk"
    empty.save_to_disk(str(d))
    with pytest.raises(InputError) as e:
        load_rows(str(d))
    assert str(e.value) == f"{d} split 'train' has no rows"
    dd = tmp_path / "empty-train"
    DatasetDict({"train": empty, "test": Dataset.from_dict({"text": ["x"], "label": [1]})}).save_to_disk(str(dd))
    with pytest.raises(InputError) as e:
        load_rows(str(dd))
    assert str(e.value) == f"{dd} split 'train' has no rows"
    assert load_rows(str(dd), split="test").dataset["text"] == ["x"]


def test_unreadable_inputs(tmp_path: Path) -> None:
    f = tmp_path / "data.xlsx"
    f.write_text("x")
    with pytest.raises(InputError) as e:
        load_rows(str(f))
    assert str(e.value) == (
        f"{f} is not a dataset file this tool reads; use csv, tsv, json, jsonl, parquet, arrow or txt, "
        "a save_to_disk directory or an image folder"
    )
    d = tmp_path / "nothing"
    d.mkdir()
    (d / "notes.md").write_text("hi")
    with pytest.raises(InputError) as e:
        load_rows(str(d))
    assert str(e.value) == (
        f"{d} holds no dataset: no save_to_disk files (dataset_info.json, state.json) and no csv, json, "
        "jsonl, parquet, arrow or image files"
    )
    cols = tmp_path / "columns.json"
    cols.write_text(json.dumps({"text": ["a", "b"], "label": [0, 1]}))
    with pytest.raises(InputError) as e:
        load_rows(str(cols))
    assert str(e.value) == (
        f"{cols} is one JSON object of columns (text, label); write it as JSON lines "
        "(Dataset.to_json) or as a list of records"
    )
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError) as e:
        load_rows(str(bad))
    assert str(e.value).startswith(f"{bad} could not be read as parquet: ")
    assert "\n" not in str(e.value)


def test_hub_id_from_the_local_cache(data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    sha = "89abcdef0123456789abcdef0123456789abcdef"
    repo = cache / "datasets--tiny-org--tiny-text"
    snap = repo / "snapshots" / sha / "data"
    snap.mkdir(parents=True)
    shutil.copy(data["splitdir"] / "train.parquet", snap / "train-00000-of-00001.parquet")
    shutil.copy(data["splitdir"] / "test.parquet", snap / "test-00000-of-00001.parquet")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    rows = load_rows("tiny-org/tiny-text")
    assert rows.path == "tiny-org/tiny-text" and rows.split == "train"
    assert set(rows.splits) == {"train", "test"} and rows.reader == "streaming"
    assert rows.features == FEATURES
    assert load_rows("tiny-org/tiny-text", split="test").num_rows_read == 1


def test_nothing_is_written_next_to_the_data(data: dict[str, Path]) -> None:
    before = sorted(p.name for p in data["disk"].iterdir())
    rows = load_rows(str(data["disk"]))
    rows.dataset.map(lambda e: {"y": 1})
    assert sorted(p.name for p in data["disk"].iterdir()) == before
