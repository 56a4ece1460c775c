"""build_batch: the pipeline a Hugging Face Trainer runs, and each input's dtype lineage.

Real datasets / transformers objects throughout: tiny models with a tokenizer, an image
processor or a feature extractor are built once per session, datasets are saved to tmp_path
and read back with load_rows.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from datasets import ClassLabel, Dataset, Features, Image, List, Value
from torch._subclasses.fake_tensor import FakeTensor

from dtype_doctor.machine.placement import Placement
from dtype_doctor.records.errors import InputError, UsageError
from dtype_doctor.load import Batch, build_batch, load_model, load_rows
from dtype_doctor.records import LINEAGE_STAGES, SourceLoc

pytestmark = pytest.mark.filterwarnings("ignore")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "</s>", "a", "b", "c", "d", "e", "hello", "world"]


def make_tokenizer(*, pad: bool = True) -> transformers.PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    kw = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "eos_token": "</s>"}
    if pad:
        kw["pad_token"] = "[PAD]"
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, **kw)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    out: dict[str, Path] = {}

    def save(name: str, model: torch.nn.Module, *side: object) -> None:
        model.save_pretrained(root / name)
        for obj in side:
            obj.save_pretrained(root / name)  # type: ignore[attr-defined]
        out[name] = root / name

    save("bert", transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=2)), make_tokenizer())
    save("llama", transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)), make_tokenizer(pad=False))
    save("t5", transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(VOCAB), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=4)), make_tokenizer())
    save("vit", transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=2)), transformers.ViTImageProcessor(size={"height": 16, "width": 16}))
    save("wav2vec2", transformers.Wav2Vec2ForSequenceClassification(transformers.Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, num_labels=2)), transformers.Wav2Vec2FeatureExtractor())
    return out


@pytest.fixture(scope="session")
def loaded(model_dirs: dict[str, Path]) -> dict[str, object]:
    return {name: load_model(str(d)) for name, d in model_dirs.items()}


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    out: dict[str, Path] = {}

    def save(name: str, ds: Dataset) -> None:
        ds.save_to_disk(str(root / name))
        out[name] = root / name

    save("text", Dataset.from_dict(
        {"text": ["a b c", "hello world", "d"], "label": [0, 1, 0], "idx": [7, 8, 9]},
        features=Features({"text": Value("string"), "label": Value("int32"), "idx": Value("int64")})))
    save("score", Dataset.from_dict({"sentence": ["a b", "c"], "score": [0.5, 2.0]}))
    save("pretok", Dataset.from_dict(
        {"input_ids": [[2, 5, 6, 3], [2, 7, 3]], "label": [1, 0]},
        features=Features({"input_ids": List(Value("int32")), "label": ClassLabel(names=["neg", "pos"])})))
    save("lm", Dataset.from_dict({"text": ["a b c d e", "hello"]}))
    save("pairs", Dataset.from_dict({"source": ["a b c", "hello world"], "target": ["d", "e a"]}))
    rng = np.random.default_rng(0)
    from PIL import Image as PILImage

    images = [PILImage.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)) for _ in range(3)]
    save("images", Dataset.from_dict(
        {"image": images, "label": [0, 1, 0]},
        features=Features({"image": Image(), "label": ClassLabel(names=["circle", "square"])})))
    save("audio", Dataset.from_dict(
        {"audio": [rng.standard_normal(1600).tolist(), rng.standard_normal(1600).tolist()],
         "sampling_rate": [16000, 16000], "label": [0, 1]}))
    save("unusable", Dataset.from_dict({"foo": [1, 2], "bar": [0.5, 1.5]}))
    return out


def rows(data_dirs: dict[str, Path], name: str, n: int = 2):  # type: ignore[no-untyped-def]
    return load_rows(str(data_dirs[name]), n=n)


def stages(batch: Batch, name: str) -> list[tuple[str, str | None]]:
    return [(s.stage, s.dtype) for s in batch.lineage[name]]


def step(batch: Batch, name: str, stage: str):  # type: ignore[no-untyped-def]
    return next(s for s in batch.lineage[name] if s.stage == stage)


def write(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code).lstrip())
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# --------------------------------------------------------------------------- text


def test_text_classification_pipeline_and_lineage(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["bert"]
    b = build_batch(lm, rows(data_dirs, "text"))
    assert b.collator == "DataCollatorWithPadding" and b.formatter == "torch"
    assert set(b.inputs) == {"input_ids", "attention_mask", "labels"}
    assert b.dropped_columns == ("text", "idx")  # Trainer's remove_unused_columns
    # int32 labels: the TorchFormatter makes them int64
    assert stages(b, "labels") == [
        ("dataset", "int32"), ("formatter", "int64"), ("collator", "int64"), ("transfer", "int64"),
        ("model-boundary", "int64"),
    ]
    assert "int32 → int64" in step(b, "labels", "formatter").detail
    assert "'label'" in step(b, "labels", "dataset").detail
    # raw text → tokenizer (stored by datasets as int32) → formatter int64
    assert stages(b, "input_ids") == [
        ("dataset", None), ("processor", "int32"), ("formatter", "int64"), ("collator", "int64"),
        ("transfer", "int64"), ("model-boundary", "int64"),
    ]
    assert step(b, "input_ids", "dataset").detail == "column 'text': string"
    # the call the task guides make: truncation only; the collator pads (max_length: this tokenizer knows no limit)
    assert "(truncation=True, max_length=128)" in step(b, "input_ids", "processor").detail
    assert "List(Value('int32'))" in step(b, "input_ids", "processor").detail
    assert b.inputs["input_ids"].shape == step(b, "input_ids", "model-boundary").shape == (2, 3)
    for steps in b.lineage.values():
        assert all(s.stage in LINEAGE_STAGES for s in steps)
        assert steps[-1].stage == "model-boundary" and steps[-1].device == "cpu"
    assert b.sources == {}
    out = lm.model(**b.inputs)
    assert torch.isfinite(out.loss)


def test_pretokenized_columns_are_used_as_stored(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    b = build_batch(loaded["bert"], rows(data_dirs, "pretok"))
    assert set(b.inputs) == {"input_ids", "attention_mask", "labels"}
    assert stages(b, "input_ids")[:2] == [("dataset", "int32"), ("formatter", "int64")]
    # tokenizer.pad (inside DataCollatorWithPadding) makes the attention mask
    assert stages(b, "attention_mask")[0] == ("collator", "int64")
    assert step(b, "attention_mask", "collator").detail == "DataCollatorWithPadding created it (tokenizer.pad)"
    assert b.inputs["input_ids"].tolist() == [[2, 5, 6, 3], [2, 7, 3, 0]]  # padded by the collator
    assert step(b, "labels", "dataset").detail == "column 'label': ClassLabel with 2 names"
    assert b.dropped_columns == ()


def test_score_column_becomes_float_labels(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    b = build_batch(loaded["bert"], rows(data_dirs, "score"))
    assert stages(b, "labels")[:3] == [("dataset", "float64"), ("formatter", "float32"), ("collator", "float32")]
    assert "float64 → float32" in step(b, "labels", "formatter").detail
    assert any("'score'" in n for n in b.notes)
    assert step(b, "input_ids", "dataset").detail == "column 'sentence': string"


def test_numpy_and_python_formats(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    b = build_batch(loaded["bert"], rows(data_dirs, "text"), dataset_format="numpy")
    assert b.formatter == "numpy"
    assert "NumpyFormatter" in step(b, "labels", "formatter").detail
    assert b.inputs["labels"].dtype == torch.int64 and isinstance(b.inputs["input_ids"], torch.Tensor)
    b = build_batch(loaded["bert"], rows(data_dirs, "text"), dataset_format="python")
    assert b.formatter == "python"
    assert [s for s, _ in stages(b, "labels")] == ["dataset", "collator", "transfer", "model-boundary"]
    assert step(b, "labels", "collator").dtype == "int64"


def test_causal_lm_labels_come_from_the_lm_collator(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["llama"]
    b = build_batch(lm, rows(data_dirs, "lm"))
    assert b.collator == "DataCollatorForLanguageModeling"
    assert any("pad token" in n for n in b.notes)  # the tokenizer had none: eos, as the HF examples do
    ids, mask, labels = b.inputs["input_ids"], b.inputs["attention_mask"], b.inputs["labels"]
    assert torch.equal(labels[mask.bool()], ids[mask.bool()])
    assert (labels[~mask.bool()] == -100).all() and (~mask.bool()).any()
    assert "copies input_ids as labels" in b.lineage["labels"][-3].detail
    assert [s for s, _ in stages(b, "labels")][:3] == ["dataset", "processor", "formatter"]
    assert torch.isfinite(lm.model(**b.inputs).loss)


def test_seq2seq_target_text_becomes_labels(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["t5"]
    b = build_batch(lm, rows(data_dirs, "pairs"))
    assert b.collator == "DataCollatorForSeq2Seq"
    assert set(b.inputs) == {"input_ids", "attention_mask", "labels"}
    assert step(b, "labels", "dataset").detail == "column 'target': string"
    assert "text_target=<target>" in step(b, "labels", "processor").detail
    assert step(b, "input_ids", "dataset").detail == "column 'source': string"
    assert b.dropped_columns == ("source",)
    assert torch.isfinite(lm.model(**b.inputs).loss)


def test_raw_text_without_a_tokenizer(model_dirs, data_dirs, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "bert-no-tok"
    shutil.copytree(model_dirs["bert"], d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    lm = load_model(str(d))
    with pytest.raises(InputError) as e:
        build_batch(lm, rows(data_dirs, "text"))
    assert str(e.value) == (
        f"dataset column 'text' is raw text but {d.resolve()} has no tokenizer (tokenizer.json / "
        "tokenizer_config.json); add one or pass --preprocess FILE.py:FUNC"
    )


def test_nothing_the_model_accepts(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError) as e:
        build_batch(loaded["vit"], rows(data_dirs, "unusable"))
    assert str(e.value) == (
        "dataset columns [foo, bar] give no input that ViTForImageClassification.forward accepts "
        "(pixel_values, interpolate_pos_encoding, attention_mask); pass --preprocess FILE.py:FUNC"
    )


# --------------------------------------------------------------------------- images and audio


def test_image_processor_path(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["vit"]
    b = build_batch(lm, rows(data_dirs, "images"))
    assert b.collator == "default_data_collator"
    assert stages(b, "pixel_values")[:3] == [("dataset", "uint8"), ("processor", "float32"), ("formatter", "float32")]
    assert "ViTImageProcessor" in step(b, "pixel_values", "processor").detail
    assert b.inputs["pixel_values"].shape == (2, 3, 16, 16)
    assert b.dropped_columns == ("image",)
    assert torch.isfinite(lm.model(**b.inputs).loss)


def test_feature_extractor_path(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["wav2vec2"]
    b = build_batch(lm, rows(data_dirs, "audio"))
    assert stages(b, "input_values")[:3] == [("dataset", "float64"), ("processor", "float32"), ("formatter", "float32")]
    assert "Wav2Vec2FeatureExtractor(sampling_rate=16000)" in step(b, "input_values", "processor").detail
    assert b.inputs["input_values"].shape == (2, 1600)
    assert b.dropped_columns == ("audio", "sampling_rate")
    assert torch.isfinite(lm.model(**b.inputs).loss)


# --------------------------------------------------------------------------- the user's preprocess

PREP = """
import numpy as np
import torch


def preprocess(example):
    pixels = np.asarray(example["image"].convert("RGB").resize((16, 16)), dtype=np.float32) / 255.0
    tensor = torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
    tensor = tensor.to(torch.float16)
    return {"pixel_values": tensor, "label": example["label"]}


def transform(batch):
    out = {"pixel_values": [], "labels": []}
    for image, label in zip(batch["image"], batch["label"]):
        pixels = np.asarray(image.convert("RGB").resize((16, 16)), dtype=np.float32) / 255.0
        out["pixel_values"].append(torch.from_numpy(pixels).permute(2, 0, 1).half())
        out["labels"].append(torch.tensor(label, dtype=torch.int32))
    return out


def tokenize(examples, tokenizer):
    return tokenizer(examples["text"], truncation=True)


def broken(example):
    raise ValueError("no pixels here\\nsecond line")


NOT_A_FUNCTION = 3
"""


@pytest.fixture()
def prep(tmp_path: Path) -> Path:
    return write(tmp_path / "prep.py", PREP)


def test_map_preprocess_fp16_is_cast_back_by_the_formatter(loaded, data_dirs, prep) -> None:  # type: ignore[no-untyped-def]
    lm = loaded["vit"]
    b = build_batch(lm, rows(data_dirs, "images"), preprocess=f"{prep}:preprocess")
    cast_line = line_of(prep, "tensor = tensor.to(torch.float16)")
    assert stages(b, "pixel_values") == [
        ("preprocess", "float16"), ("formatter", "float32"), ("collator", "float32"), ("transfer", "float32"),
        ("model-boundary", "float32"),
    ]
    pre = step(b, "pixel_values", "preprocess")
    assert pre.source == SourceLoc(str(prep), cast_line)
    assert "torch.float16 tensor" in pre.detail and "List(List(List(Value('float16'))))" in pre.detail
    assert "float16 → float32" in step(b, "pixel_values", "formatter").detail
    assert b.sources["pixel_values"] == SourceLoc(str(prep), cast_line)
    assert b.sources["labels"] == SourceLoc(str(prep), line_of(prep, 'return {"pixel_values"'))
    assert b.dropped_columns == ("image",)
    assert not (prep.parent / "__pycache__").exists()  # nothing written in the user's directory
    assert b.inputs["pixel_values"].dtype == torch.float32


def test_transform_preprocess_keeps_fp16_and_int32(loaded, data_dirs, prep) -> None:  # type: ignore[no-untyped-def]
    b = build_batch(loaded["vit"], rows(data_dirs, "images"), preprocess=f"{prep}:transform", preprocess_mode="transform")
    assert b.formatter == "custom (with_transform)" and b.collator == "default_data_collator"
    assert stages(b, "pixel_values") == [
        ("preprocess", "float16"), ("collator", "float16"), ("transfer", "float16"), ("model-boundary", "float16"),
    ]
    pre = step(b, "pixel_values", "preprocess")
    assert pre.shape == (3, 16, 16) and pre.device == "cpu" and "not stored in Arrow" in pre.detail
    assert b.inputs["labels"].dtype == torch.int32  # default_data_collator stacks tensors as they are
    assert stages(b, "labels")[0] == ("preprocess", "int32") and stages(b, "labels")[-1] == ("model-boundary", "int32")
    assert b.sources["pixel_values"].line == line_of(prep, 'out["pixel_values"].append')
    # a per-example function in transform mode runs row by row
    b = build_batch(loaded["vit"], rows(data_dirs, "images"), preprocess=f"{prep}:preprocess", preprocess_mode="transform")
    assert b.inputs["pixel_values"].dtype == torch.float16 and b.inputs["labels"].dtype == torch.int64


def test_batched_preprocess_gets_the_tokenizer(loaded, data_dirs, prep) -> None:  # type: ignore[no-untyped-def]
    b = build_batch(loaded["bert"], rows(data_dirs, "text"), preprocess=f"{prep}:tokenize")
    assert stages(b, "input_ids")[:2] == [("preprocess", "int32"), ("formatter", "int64")]
    assert b.sources["input_ids"] == SourceLoc(str(prep), line_of(prep, 'return tokenizer(examples["text"]'))
    assert all(s.stage != "processor" for s in b.lineage["input_ids"])


def test_preprocess_errors(loaded, data_dirs, prep, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lm, r = loaded["vit"], rows(data_dirs, "images")
    with pytest.raises(UsageError) as e:
        build_batch(lm, r, preprocess="prep.py")
    assert str(e.value) == "--preprocess must be FILE.py:FUNC, got 'prep.py'"
    missing = tmp_path / "missing.py"
    with pytest.raises(InputError) as e:
        build_batch(lm, r, preprocess=f"{missing}:f")
    assert str(e.value) == f"preprocess file {missing} does not exist; pass --preprocess FILE.py:FUNC with an existing file"
    with pytest.raises(InputError) as e:
        build_batch(lm, r, preprocess=f"{prep}:nope")
    assert str(e.value) == (
        f"preprocess file {prep} has no function 'nope' (functions there: broken, preprocess, tokenize, transform)"
    )
    with pytest.raises(InputError) as e:
        build_batch(lm, r, preprocess=f"{prep}:NOT_A_FUNCTION")
    assert str(e.value) == f"{prep}:NOT_A_FUNCTION is a int, not a function; pass --preprocess FILE.py:FUNC"
    for mode in ("map", "transform"):
        with pytest.raises(InputError) as e:
            build_batch(lm, r, preprocess=f"{prep}:broken", preprocess_mode=mode)
        assert str(e.value) == f"preprocess function {prep}:broken raised ValueError: no pixels here"
    bad = write(tmp_path / "bad.py", "def f(x):\n    return {x: }\n")
    with pytest.raises(InputError) as e:
        build_batch(lm, r, preprocess=f"{bad}:f")
    assert str(e.value).startswith(f"preprocess file {bad} has a syntax error at line 2: ")
    boom = write(tmp_path / "boom.py", "import no_such_module_dd\n")
    with pytest.raises(InputError) as e:
        build_batch(lm, r, preprocess=f"{boom}:f")
    assert str(e.value) == (
        f"preprocess file {boom} failed to import: ModuleNotFoundError: No module named 'no_such_module_dd'"
    )
    assert not (tmp_path / "__pycache__").exists()


def test_bad_modes(loaded, data_dirs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as e:
        build_batch(loaded["bert"], rows(data_dirs, "text"), preprocess_mode="lazy")
    assert str(e.value) == "preprocess mode 'lazy' is not one of map, transform"
    with pytest.raises(UsageError) as e:
        build_batch(loaded["bert"], rows(data_dirs, "text"), dataset_format="pandas")
    assert str(e.value) == "dataset format 'pandas' is not one of torch, numpy, python"


# --------------------------------------------------------------------------- transfer


def test_simulated_transfer_makes_fake_cuda_inputs(model_dirs, data_dirs) -> None:  # type: ignore[no-untyped-def]
    from dtype_doctor.machine.home import simulated_home

    lm = load_model(str(model_dirs["bert"]), placement=Placement("cuda:0", simulated=True), dtype="float16")
    b = build_batch(lm, rows(data_dirs, "text"), device="cuda:0")
    for name, t in b.inputs.items():
        assert isinstance(t, FakeTensor) and t.fake_mode is lm.fake_mode
        # where every simulated tensor of the step lives (meta on a CPU-only build), named cuda:0 below
        assert t.device == simulated_home("cuda:0", fakes_cuda=True)
        tr = step(b, name, "transfer")
        assert tr.device == "cuda:0" and "fake tensor" in tr.detail
        assert b.lineage[name][-1].device == "cuda:0"
    assert b.device == "cuda:0"
    assert b.inputs["labels"].dtype == torch.int64
