"""The traced batch is the batch the user's default Hugging Face pipeline builds.

For each modality, the expected batch is made here by calling the model's own processor and
collator directly, as the HF example scripts and ``Trainer`` do (their defaults), and compared
with ``build_batch``'s, value for value; map and transform modes give the same batch.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from dtype_doctor.load import build_batch, load_model, load_rows
from dtype_doctor.load.batch import STAGES

pytestmark = pytest.mark.filterwarnings("ignore")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture_model(name: str):  # type: ignore[no-untyped-def]
    return load_model(str(FIXTURES / "models" / name))


def fixture_rows(name: str, n: int = 2):  # type: ignore[no-untyped-def]
    return load_rows(str(FIXTURES / "data" / name), n=n)


def word_tokenizer(vocab: list[str], **special: str) -> transformers.PreTrainedTokenizerBase:
    """A whitespace word-level tokenizer over `vocab`; `special` names its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=special["unk_token"]))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, **special)


def per_row(columns: dict) -> list[dict]:  # type: ignore[type-arg]
    """Columns → one dict a row, as a DataLoader hands rows to the collator."""
    n = len(next(iter(columns.values())))
    return [{k: v[i] for k, v in columns.items()} for i in range(n)]


def assert_same_batch(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert got[key].dtype == want.dtype, key
        assert got[key].shape == want.shape, key
        assert torch.equal(got[key], want), key


def test_the_stage_list_is_the_pipeline_order() -> None:
    assert [name for name, _ in STAGES] == ["dataset", "preprocess", "processor", "formatter", "collator", "transfer"]


# --------------------------------------------------------------------------- text


def test_text_classification_is_the_task_guide_batch() -> None:
    loaded, rows = fixture_model("bert-tiny"), fixture_rows("text-cls")
    b = build_batch(loaded, rows)
    # the text-classification task guide: tokenizer(text, truncation=True) in map, DataCollatorWithPadding
    tok = loaded.tokenizer
    data = rows.dataset[:]
    enc = tok(data["text"], truncation=True)
    features = per_row({**enc, "label": data["label"]})
    expected = dict(transformers.DataCollatorWithPadding(tok)(features))
    assert_same_batch(dict(b.inputs), expected)
    assert torch.isfinite(loaded.model(**b.inputs).loss)


def test_seq2seq_is_the_summarization_script_batch() -> None:
    loaded, rows = fixture_model("t5-tiny"), fixture_rows("t5-pairs")
    b = build_batch(loaded, rows)
    tok = loaded.tokenizer
    data = rows.dataset[:]
    # run_summarization.py with its defaults: no padding in map, labels = text_target ids
    enc = tok(data["source"], truncation=True)
    labels = tok(text_target=data["target"], truncation=True)["input_ids"]
    features = per_row({**enc, "labels": labels})
    expected = dict(transformers.DataCollatorForSeq2Seq(tok)(features))
    assert_same_batch(dict(b.inputs), expected)
    assert torch.isfinite(loaded.model(**b.inputs).loss)


# --------------------------------------------------------------------------- images


@pytest.mark.parametrize(("model", "data"), [("vit-tiny", "images-ds"), ("resnet-tiny", "images")])
def test_images_are_the_image_processor_default_call(model: str, data: str) -> None:
    loaded, rows = fixture_model(model), fixture_rows(data)
    b = build_batch(loaded, rows)
    sample = rows.dataset[:]
    pixels = loaded.image_processor([im.convert("RGB") for im in sample["image"]], return_tensors="pt")
    expected = dict(transformers.default_data_collator(per_row({**pixels, "label": sample["label"]})))
    assert_same_batch(dict(b.inputs), expected)
    assert loaded.model(**b.inputs).logits.shape[0] == 2


# --------------------------------------------------------------------------- audio


def test_wav2vec2_is_the_audio_classification_script_batch() -> None:
    loaded, rows = fixture_model("wav2vec2-tiny"), fixture_rows("audio")
    b = build_batch(loaded, rows)
    fe = loaded.feature_extractor
    sample = rows.dataset[:]
    # run_audio_classification.py: feature_extractor(arrays, sampling_rate=…) with no padding,
    # and Trainer's default collator for a feature extractor pads each batch
    out = fe([np.asarray(a) for a in sample["audio"]], sampling_rate=sample["sampling_rate"][0])
    features = per_row({**out, "label": sample["label"]})
    expected = dict(transformers.DataCollatorWithPadding(fe)(features))
    assert_same_batch(dict(b.inputs), expected)
    assert b.collator == "DataCollatorWithPadding"
    assert torch.isfinite(loaded.model(**b.inputs).loss)


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("whisper")
    config = transformers.WhisperConfig(
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=80, vocab_size=64, num_labels=2,
    )
    transformers.WhisperForAudioClassification(config).save_pretrained(d)
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(d)
    return d


def test_whisper_gets_the_30_second_features_its_encoder_requires(whisper_dir: Path) -> None:
    loaded, rows = load_model(str(whisper_dir)), fixture_rows("audio")
    b = build_batch(loaded, rows)
    fe = loaded.feature_extractor
    sample = rows.dataset[:]
    arrays = [np.asarray(a) for a in sample["audio"]]
    # run_speech_recognition_seq2seq.py: feature_extractor(array, sampling_rate=…), its default
    # padding="max_length" = 30 s
    out = fe(arrays, sampling_rate=sample["sampling_rate"][0])
    features = per_row({**out, "label": sample["label"]})
    expected = dict(transformers.DataCollatorWithPadding(fe)(features))
    assert_same_batch(dict(b.inputs), expected)
    assert b.inputs["input_features"].shape == (2, 80, 3000)
    assert torch.isfinite(loaded.model(**b.inputs).loss)
    # the batch a padding=True call makes is one the model rejects
    short = fe(arrays, sampling_rate=sample["sampling_rate"][0], padding=True, return_tensors="pt")
    assert short["input_features"].shape[-1] < 3000
    with pytest.raises(ValueError):
        loaded.model(input_features=short["input_features"])


ASR_VOCAB = ["<pad>", "<unk>", "<|startoftranscript|>", "<|endoftext|>", "low", "high", "tone"]


@pytest.fixture(scope="module")
def whisper_asr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("whisper-asr")
    tok = word_tokenizer(ASR_VOCAB, unk_token="<unk>", pad_token="<pad>", bos_token="<|startoftranscript|>",
                         eos_token="<|endoftext|>")
    config = transformers.WhisperConfig(
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=80, vocab_size=len(ASR_VOCAB), max_target_positions=32,
        decoder_start_token_id=2, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )
    transformers.WhisperForConditionalGeneration(config).save_pretrained(d)
    transformers.WhisperProcessor(feature_extractor=transformers.WhisperFeatureExtractor(feature_size=80),
                                  tokenizer=tok).save_pretrained(d)
    return d


def test_whisper_speech_to_text_labels_are_the_transcripts(whisper_asr_dir: Path, tmp_path: Path) -> None:
    from datasets import Dataset

    audio = fixture_rows("audio").dataset
    Dataset.from_dict({"audio": audio["audio"], "sampling_rate": audio["sampling_rate"],
                       "text": ["low tone", "high"]}).save_to_disk(str(tmp_path / "asr"))
    loaded, rows = load_model(str(whisper_asr_dir)), load_rows(str(tmp_path / "asr"), n=2)
    b = build_batch(loaded, rows)
    sample = rows.dataset[:]
    fe, tok = loaded.feature_extractor, loaded.tokenizer
    features = fe([np.asarray(a) for a in sample["audio"]], sampling_rate=sample["sampling_rate"][0],
                  return_tensors="pt")["input_features"]
    ids = tok(sample["text"]).input_ids
    width = max(map(len, ids))
    labels = torch.tensor([i + [-100] * (width - len(i)) for i in ids])  # padding never scored
    assert_same_batch(dict(b.inputs), {"input_features": features, "labels": labels})
    assert b.collator == "DataCollatorSpeechSeq2SeqWithPadding"
    assert b.lineage["labels"][0].detail == "column 'text': string"
    assert torch.isfinite(loaded.model(**b.inputs).loss)


# --------------------------------------------------------------------------- text + images


CLIP_VOCAB = ["[PAD]", "[UNK]", "<s>", "</s>", "a", "photo", "of", "circle", "square"]


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("clip")
    tok = word_tokenizer(CLIP_VOCAB, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>", eos_token="</s>")
    ip = transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    config = transformers.CLIPConfig(
        text_config={"vocab_size": len(CLIP_VOCAB), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 16, "eos_token_id": 3, "pad_token_id": 0,
                     "bos_token_id": 2},
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 8},
        projection_dim=8,
    )
    transformers.CLIPModel(config).save_pretrained(d)
    transformers.CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(d)
    return d


def test_clip_gets_its_processor_default_call(clip_dir: Path, tmp_path: Path) -> None:
    from datasets import Dataset, Features, Image, Value

    images = fixture_rows("images-ds").dataset
    captions = Dataset.from_dict(
        {"image": images["image"], "caption": ["a photo of a circle", "square"]},
        features=Features({"image": Image(), "caption": Value("string")}),
    )
    captions.save_to_disk(str(tmp_path / "captions"))
    loaded, rows = load_model(str(clip_dir)), load_rows(str(tmp_path / "captions"), n=2)
    b = build_batch(loaded, rows)
    sample = rows.dataset[:]
    out = loaded.processor(text=sample["caption"], images=[im.convert("RGB") for im in sample["image"]])
    features = per_row(dict(out))
    expected = dict(transformers.DataCollatorWithPadding(loaded.tokenizer)(features))
    assert_same_batch(dict(b.inputs), expected)
    assert [s.stage for s in b.lineage["pixel_values"]][:2] == ["dataset", "processor"]
    assert "CLIPProcessor(text=<caption>, images=<image>)" in b.lineage["input_ids"][1].detail
    assert loaded.model(**b.inputs).logits_per_image.shape == (2, 2)


# --------------------------------------------------------------------------- map = transform

PREP = """
import numpy as np


def tokenize(batch, tokenizer):
    return {**tokenizer(batch["text"], truncation=True), "label": batch["label"]}


def pixels(batch, image_processor):
    out = image_processor([im.convert("RGB") for im in batch["image"]], return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "label": batch["label"]}


def features(batch, feature_extractor):
    out = feature_extractor([np.asarray(a) for a in batch["audio"]], sampling_rate=batch["sampling_rate"][0])
    return {"input_values": out["input_values"], "label": batch["label"]}
"""


@pytest.mark.parametrize(("model", "data", "func"), [
    ("bert-tiny", "text-cls", "tokenize"),
    ("vit-tiny", "images-ds", "pixels"),
    ("wav2vec2-tiny", "audio", "features"),
])
def test_map_and_transform_give_the_default_pipeline_batch(model: str, data: str, func: str, tmp_path: Path) -> None:
    prep = tmp_path / "prep.py"
    prep.write_text(textwrap.dedent(PREP).lstrip())
    loaded, rows = fixture_model(model), fixture_rows(data)
    default = build_batch(loaded, rows)
    mapped = build_batch(loaded, rows, preprocess=f"{prep}:{func}", preprocess_mode="map")
    transformed = build_batch(loaded, rows, preprocess=f"{prep}:{func}", preprocess_mode="transform")
    assert_same_batch(dict(mapped.inputs), dict(default.inputs))
    assert_same_batch(dict(transformed.inputs), dict(default.inputs))
    assert mapped.collator == transformed.collator == default.collator
    # every returned column has its preprocess step in both modes; the formatter runs only
    # where rows were stored in Arrow
    for name in default.inputs:
        mapped_stages = [s.stage for s in mapped.lineage[name]]
        assert "preprocess" in mapped_stages
        assert [s.stage for s in transformed.lineage[name]] == [s for s in mapped_stages if s != "formatter"]
