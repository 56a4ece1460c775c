"""The checked-in fixtures load offline, have the advertised shapes/dtypes, and
are exactly what fixtures/generate.py produces."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoConfig, AutoFeatureExtractor, AutoImageProcessor, AutoTokenizer

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from datasets import ClassLabel, Features, Image, List, Value, load_dataset, load_from_disk  # noqa: E402
from helpers_errors import raises_dtype_error  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
HAND_WRITTEN = {"generate.py", "README.md", ".gitignore", "demo/prep.py"}


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generate():
    return _load_module("fixtures_generate", FIXTURES / "generate.py")


def _load_model(rel: str, **kwargs):
    path = FIXTURES / rel
    config = AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    return config, cls.from_pretrained(path, **kwargs).eval()


# ---------------------------------------------------------------- generate.py


def test_generate_is_importable(generate):
    assert callable(generate.build_all)
    assert callable(generate.make_big_parquet)
    assert callable(generate.main)
    assert generate.FIXTURES_DIR == FIXTURES


@pytest.mark.parametrize("rows,row_group_size,groups", [(1000, 100_000, 1), (1000, 300, 4), (0, 100_000, 1)])
def test_make_big_parquet_writes_requested_rows(generate, tmp_path, rows, row_group_size, groups):
    path = generate.make_big_parquet(tmp_path / "big.parquet", rows, row_group_size=row_group_size)
    meta = pq.read_metadata(path)
    assert meta.num_rows == rows
    assert meta.num_row_groups == groups
    assert pq.read_schema(path).remove_metadata() == pq.read_schema(FIXTURES / "data/text-cls.parquet").remove_metadata()
    table = pq.read_table(path)
    assert set(table.column("label").to_pylist()) <= {0, 1, 2}


def test_big_parquet_cli(generate, tmp_path):
    out = tmp_path / "sub" / "big.parquet"
    assert generate.main(["--big-parquet", str(out), "--rows", "1000", "--quiet"]) == 0
    assert pq.read_metadata(out).num_rows == 1000
    first = pq.read_table(out).slice(0, 16).to_pylist()
    assert first == pq.read_table(FIXTURES / "data/text-cls.parquet").to_pylist()


def test_generate_reproduces_checked_in_fixtures(generate, tmp_path):
    """Regenerating gives byte-identical files; a failure means run `python fixtures/generate.py`."""
    generate.build_all(tmp_path, verbose=False)

    def files(root):
        return {
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    fresh = files(tmp_path)
    checked_in = {f for f in files(FIXTURES) if f not in HAND_WRITTEN and f != "data/big.parquet"}
    assert fresh == checked_in
    assert all(any(f == g or f.startswith(g + "/") for g in generate.GENERATED) for f in fresh)
    differ = [f for f in sorted(fresh) if _content(tmp_path / f) != _content(FIXTURES / f)]
    assert not differ, f"stale fixtures (re-run python fixtures/generate.py): {differ}"


def _content(path):
    """A file's content, less the library-version stamps a newer release writes differently
    (config.json's transformers_version, parquet's writer metadata); everything else byte for byte."""
    if path.suffix == ".json":
        import json

        def strip(obj):
            if isinstance(obj, dict):
                return {k: strip(v) for k, v in obj.items() if k != "transformers_version"}
            if isinstance(obj, list):
                return [strip(v) for v in obj]
            return obj

        return strip(json.loads(path.read_text()))
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return (table.schema.remove_metadata(), table.to_pylist())
    return path.read_bytes()


def test_fixtures_folder_is_small():
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file() and p.name != "big.parquet")
    assert total < 8 * 1024 * 1024


# ---------------------------------------------------------------- models

MODELS = [
    ("models/bert-tiny", "BertForSequenceClassification", torch.float32),
    ("models/bert-tiny-regression", "BertForSequenceClassification", torch.float32),
    ("models/llama-tiny", "LlamaForCausalLM", torch.float32),
    ("models/t5-tiny", "T5ForConditionalGeneration", torch.float32),
    ("models/resnet-tiny", "ResNetForImageClassification", torch.float32),
    ("models/vit-tiny", "ViTForImageClassification", torch.float32),
    ("models/wav2vec2-tiny", "Wav2Vec2ForSequenceClassification", torch.float32),
    ("demo/model", "ResNetForImageClassification", torch.float16),
    ("models/llava-tiny", "LlavaForConditionalGeneration", torch.bfloat16),
]


@pytest.mark.parametrize("rel,arch,dtype", MODELS, ids=[m[0] for m in MODELS])
def test_model_loads_offline_with_expected_arch_and_dtype(rel, arch, dtype):
    path = FIXTURES / rel
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    config, model = _load_model(rel, dtype="auto")
    assert config.architectures == [arch]
    assert type(model).__name__ == arch
    assert model.dtype == dtype
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert str(config.dtype).replace("torch.", "") == str(dtype).replace("torch.", "")


def _texts(split="train"):
    return list(load_from_disk(str(FIXTURES / "data/text-cls"))[split]["text"])


@pytest.mark.parametrize("rel,num_labels", [("models/bert-tiny", 3), ("models/bert-tiny-regression", 1)])
def test_bert_forward(rel, num_labels):
    tok = AutoTokenizer.from_pretrained(FIXTURES / rel)
    assert tok.is_fast
    config, model = _load_model(rel)
    assert config.num_labels == num_labels
    if num_labels == 1:
        assert config.problem_type == "regression"
    else:
        assert config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    enc = tok(_texts() + _texts("test"), padding=True, return_tensors="pt")
    assert not (enc["input_ids"] == tok.unk_token_id).any()
    assert enc["input_ids"].max() < config.vocab_size
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (16, num_labels) and logits.dtype == torch.float32


def test_llama_forward_pad_token_and_inv_freq():
    tok = AutoTokenizer.from_pretrained(FIXTURES / "models/llama-tiny")
    assert tok.is_fast and tok.pad_token is not None and tok.pad_token_id is not None
    config, model = _load_model("models/llama-tiny", dtype="auto")
    assert config.pad_token_id == tok.pad_token_id
    buffers = dict(model.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    texts = list(load_from_disk(str(FIXTURES / "data/lm-text"))["text"])
    enc = tok(texts, padding=True, return_tensors="pt")
    assert enc["input_ids"].max() < config.vocab_size
    with torch.no_grad():
        out = model(**enc, labels=enc["input_ids"])
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.loss)


def test_t5_forward_and_keep_in_fp32():
    tok = AutoTokenizer.from_pretrained(FIXTURES / "models/t5-tiny")
    assert tok.is_fast
    config, model = _load_model("models/t5-tiny", dtype="auto")
    assert "wo" in model._keep_in_fp32_modules
    pairs = load_from_disk(str(FIXTURES / "data/t5-pairs"))
    enc = tok(list(pairs["source"]), text_target=list(pairs["target"]), padding=True, return_tensors="pt")
    assert not (enc["input_ids"] == tok.unk_token_id).any()
    with torch.no_grad():
        out = model(**enc)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.loss)


@pytest.mark.parametrize("rel", ["models/resnet-tiny", "models/vit-tiny"])
def test_image_models_forward(rel):
    proc = AutoImageProcessor.from_pretrained(FIXTURES / rel)
    _, model = _load_model(rel, dtype="auto")
    ds = load_from_disk(str(FIXTURES / "data/images-ds"))
    pixel_values = proc(images=list(ds["image"]), return_tensors="pt")["pixel_values"]
    assert pixel_values.shape == (8, 3, 32, 32) and pixel_values.dtype == torch.float32
    with torch.no_grad():
        out = model(pixel_values=pixel_values, labels=torch.tensor(list(ds["label"])))
    assert out.logits.shape == (8, 2) and torch.isfinite(out.loss)


def test_wav2vec2_forward():
    fe = AutoFeatureExtractor.from_pretrained(FIXTURES / "models/wav2vec2-tiny")
    assert fe.sampling_rate == 16_000
    _, model = _load_model("models/wav2vec2-tiny", dtype="auto")
    ds = load_from_disk(str(FIXTURES / "data/audio"))
    clips = [np.asarray(a) for a in list(ds["audio"])]
    assert clips[0].dtype == np.float64
    inputs = fe(clips, sampling_rate=ds[0]["sampling_rate"], return_tensors="pt")
    assert inputs["input_values"].dtype == torch.float32
    with torch.no_grad():
        out = model(**inputs, labels=torch.tensor(list(ds["label"])))
    assert out.logits.shape == (4, 2) and torch.isfinite(out.loss)


# ---------------------------------------------------------------- demo


def test_demo_plain_forward_raises_real_dtype_error():
    # No dtype argument: transformers v5 defaults to dtype="auto", i.e. the checkpoint's float16.
    _, model = _load_model("demo/model")
    assert model.dtype == torch.float16
    proc = AutoImageProcessor.from_pretrained(FIXTURES / "demo/model")
    ds = load_from_disk(str(FIXTURES / "demo/data"))
    pixel_values = proc(images=list(ds["image"])[:4], return_tensors="pt")["pixel_values"]
    assert pixel_values.dtype == torch.float32
    with raises_dtype_error("float32", "float16"):
        model(pixel_values=pixel_values)


def test_demo_prep_casts_to_half_on_its_own_line():
    prep = _load_module("fixtures_demo_prep", FIXTURES / "demo/prep.py")
    ds = load_from_disk(str(FIXTURES / "demo/data"))
    out = prep.preprocess(ds[0])
    assert set(out) == {"pixel_values", "label"}
    assert out["pixel_values"].shape == (3, 32, 32)
    assert out["pixel_values"].dtype == torch.float16
    assert out["label"] == ds[0]["label"]
    lines = [line.strip() for line in (FIXTURES / "demo/prep.py").read_text().splitlines()]
    assert "tensor = tensor.to(torch.float16)" in lines


# ---------------------------------------------------------------- data

TEXT_CLS = Features({"text": Value("string"), "label": ClassLabel(names=["negative", "neutral", "positive"])})
IMAGES = Features({"image": Image(), "label": ClassLabel(names=["circle", "square"])})

DATASETS = [
    ("data/text-pretok", 16, Features({
        "input_ids": List(Value("int32")), "attention_mask": List(Value("int32")), "label": Value("int32"),
    })),
    ("data/text-regression-int", 10, Features({"text": Value("string"), "label": Value("int64")})),
    ("data/lm-text", 12, Features({"text": Value("string")})),
    ("data/t5-pairs", 8, Features({"source": Value("string"), "target": Value("string")})),
    ("data/images-ds", 8, IMAGES),
    ("data/audio", 4, Features({
        "audio": List(Value("float64")), "sampling_rate": Value("int64"),
        "label": ClassLabel(names=["low", "high"]),
    })),
    ("demo/data", 8, IMAGES),
    ("data/image-text", 8, Features({"image": Image(), "text": Value("string")})),
]


@pytest.mark.parametrize("rel,rows,features", DATASETS, ids=[d[0] for d in DATASETS])
def test_dataset_schema(rel, rows, features):
    ds = load_from_disk(str(FIXTURES / rel))
    assert isinstance(ds, datasets.Dataset)
    assert ds.num_rows == rows
    assert ds.features == features


def test_text_cls_dict_and_data_files_match(tmp_path):
    dd = load_from_disk(str(FIXTURES / "data/text-cls"))
    assert set(dd) == {"train", "test"}
    assert dd["train"].features == TEXT_CLS and dd["test"].features == TEXT_CLS
    rows = [(r["text"], r["label"]) for split in ("train", "test") for r in dd[split]]
    assert len(rows) == 16
    for builder, name in [("csv", "text-cls.csv"), ("json", "text-cls.jsonl"), ("parquet", "text-cls.parquet")]:
        ds = load_dataset(builder, data_files=str(FIXTURES / "data" / name), split="train", cache_dir=str(tmp_path))
        assert [(r["text"], r["label"]) for r in ds] == rows, name


def test_text_pretok_is_padded_and_in_vocab():
    ds = load_from_disk(str(FIXTURES / "data/text-pretok"))
    tok = AutoTokenizer.from_pretrained(FIXTURES / "models/bert-tiny")
    ids = np.array(list(ds["input_ids"]))
    assert ids.shape == (16, 24) and ids.max() < len(tok)
    # Stored as int32 on disk (datasets' numpy/torch formatters upcast to int64 on read).
    schema = ds.data.schema
    assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert schema.field("attention_mask").type == pa.list_(pa.int32())
    assert schema.field("label").type == pa.int32()


def test_imagefolder_layout(tmp_path):
    root = FIXTURES / "data/images"
    pngs = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    assert pngs == [f"train/{c}/{n}.png" for c in ("circle", "square") for n in range(4)]
    ds = load_dataset("imagefolder", data_dir=str(root), split="train", cache_dir=str(tmp_path))
    assert ds.num_rows == 8
    assert ds.features["label"] == ClassLabel(names=["circle", "square"])
    assert ds[0]["image"].size == (32, 32) and ds[0]["image"].mode == "RGB"
