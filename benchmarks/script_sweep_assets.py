"""The small assets the script sweep's public scripts read, made here: no download, nothing fetched.

`make_assets(root)` writes, once per root (a marker file holds the version):

  models/      tiny transformers models built from configs and saved with save_pretrained
               (gpt2, llama, bert, t5), each with the llama-tiny / bert-tiny fixture tokenizer, and
               `sd-tiny`: a Stable Diffusion pipeline folder (CLIP text encoder and a character-level
               CLIPTokenizer, a two-block UNet and VAE, DDPM) as diffusers' training examples load it
  data/        tiny datasets: a wikitext-2 folder (train/valid/test.txt), nanoGPT's
               shakespeare_char (train.bin, val.bin, meta.pkl), an input.txt for minGPT, text
               csv/json files for the transformers examples, an image folder, and `sd-images`
               (16x16 PNGs with a metadata.jsonl of captions: diffusers' imagefolder layout)
  stubs/       stand-ins for packages the shared venv lacks, put first on the scripts'
               PYTHONPATH: `torchvision` (MNIST/FakeData/ImageFolder of generated images, the
               transforms the examples use, save_image), `evaluate` (accuracy/glue metrics),
               `sentencepiece` and `tiktoken` (imported, never called, by llama2.c and nanoGPT's sample.py) and `trl_dist` (the dist-info
               trl asks importlib.metadata for when it runs from its checkout), `torchcodec` (the
               WAV files below decoded with the stdlib `wave`: datasets 4.x decodes Audio with it)
               and `wandb` (imported, its Table built, never logged to).
  hub/         also `facebook/bart-base` (a tiny BART) and the prepared datasets
               `zeroshot/twitter-financial-news-sentiment` (text, label) and
               `mozilla-foundation/common_voice_11_0` "hi" (16 kHz WAV clips with sentences), with
               `whisper-tiny`: a tiny Whisper (8 mel bins, 1-second windows) and its processor.
               They keep the real packages' dtypes (ToTensor gives float32 in [0, 1], labels are
               Python ints the collate makes int64), so a dtype finding under them is the
               script's own.

Run `python benchmarks/script_sweep_assets.py DIR` to make them by hand.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "models"
VERSION = "23"
WORDS = ("the cat sat on a mat while the dog ran to the red ball and a bird sang in the tall tree "
         "by the river where the boy read an old book about ships").split()


def make_assets(root: Path) -> Path:
    """Make every asset under `root` (skipped when the marker says this version is there)."""
    root = Path(root)
    marker = root / ".assets-version"
    if marker.is_file() and marker.read_text() == VERSION:
        return root
    root.mkdir(parents=True, exist_ok=True)
    _stubs(root / "stubs")
    _text_data(root / "data")
    _models(root / "models")
    _images(root / "data" / "images")
    _sd_pipeline(root / "models" / "sd-tiny")
    _captioned_images(root / "data" / "sd-images")
    _hub(root)
    _seq2seq_hub(root)
    _speech(root)
    marker.write_text(VERSION)
    return root


def _sentences(n: int, seed: int) -> list[str]:
    import random

    rnd = random.Random(seed)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(6, 14))) for _ in range(n)]


def _text_data(data: Path) -> None:
    import numpy as np

    wiki = data / "wikitext-2"
    wiki.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 60), ("valid", 20), ("test", 20)):
        (wiki / f"{split}.txt").write_text("\n".join(_sentences(n, hash(split) % 97)) + "\n")
    text = "O God, O God!\n" + "\n".join(_sentences(200, 3)) + "\n"  # minGPT's chargpt samples from "O God, O God!"
    (data / "input.txt").write_text(text)
    shakes = data / "shakespeare_char"
    shakes.mkdir(exist_ok=True)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    ids[: len(ids) * 9 // 10].tofile(shakes / "train.bin")
    ids[len(ids) * 9 // 10:].tofile(shakes / "val.bin")
    with open(shakes / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    rows = [{"text": s, "sentence": s, "label": i % 2} for i, s in enumerate(_sentences(24, 5))]
    for split, part in (("train", rows[:16]), ("validation", rows[16:])):
        _write_csv(data / f"cls-{split}.csv", part, ("sentence", "label"))
        (data / f"text-{split}.txt").write_text("\n".join(r["text"] for r in part) + "\n")
        with open(data / f"text-{split}.json", "w") as f:
            for r in part:
                f.write(json.dumps({"text": r["text"]}) + "\n")
        with open(data / f"summ-{split}.json", "w") as f:
            for r in part:
                f.write(json.dumps({"text": r["text"], "summary": " ".join(r["text"].split()[:4])}) + "\n")
    stories = data / "TinyStories_all_data"  # llama2.c's pretokenized shards (uint16 ids < 512)
    stories.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    for k in range(2):
        rng.integers(1, 512, 4000).astype(np.uint16).tofile(stories / f"data{k:02d}.bin")
    lm = data / "lm-folder"  # a folder load_dataset(path) reads as train/test splits (peft's examples)
    lm.mkdir(exist_ok=True)
    for split, part in (("train", rows[:16]), ("test", rows[16:])):
        with open(lm / f"{split}.jsonl", "w") as f:
            for r in part:
                f.write(json.dumps({"text": r["text"], "label": r["label"]}) + "\n")
    for name, make in (("pref-folder", lambda r: {"prompt": r["text"][:20], "chosen": r["text"][20:], "rejected": r["text"][::-1][:20]}),
                       ("kto-folder", lambda r: {"prompt": r["text"][:20], "completion": r["text"][20:], "label": bool(r["label"])}),
                       ("prompt-folder", lambda r: {"prompt": r["text"]})):  # trl's preference / KTO / GRPO data
        (data / name).mkdir(exist_ok=True)
        for split, part in (("train", rows[:16]), ("test", rows[16:])):
            with open(data / name / f"{split}.jsonl", "w") as f:
                for r in part:
                    f.write(json.dumps(make(r)) + "\n")
    with open(data / "alpaca.json", "w") as f:
        json.dump([{"instruction": s, "input": "", "output": " ".join(s.split()[:5])} for s in _sentences(12, 9)], f)
    (data / "alpaca-folder").mkdir(exist_ok=True)  # load_dataset(folder): datasets 4 reads no lone file path
    with open(data / "alpaca-folder" / "train.jsonl", "w") as f:
        for s in _sentences(12, 9):
            f.write(json.dumps({"instruction": s, "input": "", "output": " ".join(s.split()[:5])}) + "\n")


def _write_csv(path: Path, rows: list[dict], cols: tuple[str, ...]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cols), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _models(models: Path) -> None:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    small = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64)
    specs = {
        "gpt2-tiny": (tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=0), tf.GPT2LMHeadModel,
                      "llama-tiny"),
        "llama-tiny": (tf.LlamaConfig(**small, num_key_value_heads=1, max_position_embeddings=64, vocab_size=0),
                       tf.LlamaForCausalLM, "llama-tiny"),
        # bitsandbytes' 4-bit CPU inference packs the weight in 64-wide blocks: every quantized layer's input >= 64
        "llama-qlora": (tf.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                                       num_key_value_heads=1, max_position_embeddings=64, vocab_size=0),
                        tf.LlamaForCausalLM, "llama-tiny"),
        "bert-tiny": (tf.BertConfig(**small, max_position_embeddings=64, vocab_size=0), tf.BertForMaskedLM,
                      "bert-tiny"),
        "t5-tiny": (tf.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=0,
                                decoder_start_token_id=0, pad_token_id=0), tf.T5ForConditionalGeneration,
                    "llama-tiny"),
    }
    for name, (config, cls, tok_from) in specs.items():
        out = models / name
        tok = tf.AutoTokenizer.from_pretrained(FIXTURES / tok_from)
        config.vocab_size = len(tok)
        for attr in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if getattr(tok, attr, None) is not None and name != "t5-tiny":
                setattr(config, attr, getattr(tok, attr))
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token or tok.unk_token
        cls(config).save_pretrained(out)
        tok.save_pretrained(out)


def _hub(root: Path) -> None:
    """An offline hub cache for scripts that name hub ids (accelerate's examples): `bert-base-cased` is the tiny
    BERT above; the `glue`/`mrpc` dataset is a prepared datasets cache (HF_DATASETS_CACHE layout), as
    `load_dataset("glue", "mrpc")` finds it offline after one earlier download."""
    import glob
    import os

    import pandas as pd

    sha = "0" * 40
    repo = root / "hub" / "models--bert-base-cased"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    if (repo / "snapshots" / sha).exists():
        shutil.rmtree(repo / "snapshots" / sha)
    shutil.copytree(root / "models" / "bert-tiny", repo / "snapshots" / sha)
    rows = _sentences(32, 11)
    parquet = root / "hub-src" / "mrpc"
    parquet.mkdir(parents=True, exist_ok=True)
    files = {}
    for k, split in enumerate(("train", "validation", "test")):
        part = rows[k * 8:(k + 1) * 8 + 8]
        frame = pd.DataFrame({"sentence1": part, "sentence2": part[::-1], "label": [i % 2 for i in range(len(part))],
                              "idx": list(range(len(part)))})
        frame.to_parquet(parquet / f"{split}.parquet")
        files[split] = str(parquet / f"{split}.parquet")
    from datasets import load_dataset

    load_dataset("parquet", data_files=files, cache_dir=str(root / "hub-src" / "prep"))
    src = next(p for p in glob.glob(str(root / "hub-src" / "prep" / "parquet" / "*" / "*" / "*")) if os.path.isdir(p))
    for name in ("glue", "nyu-mll___glue"):  # load_dataset("glue", ...) and ("nyu-mll/glue", ...)
        dst = root / "datasets-cache" / name / "mrpc" / "0.0.0" / os.path.basename(src)
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        for f in os.listdir(src):
            if not f.endswith(".lock"):
                shutil.copy(os.path.join(src, f), dst / f.replace("parquet-", "glue-"))
        info = json.loads((dst / "dataset_info.json").read_text())
        info.update(config_name="mrpc", builder_name="glue", dataset_name="glue")
        (dst / "dataset_info.json").write_text(json.dumps(info))


def _hub_model(root: Path, repo_id: str, folder: Path) -> None:
    """`repo_id` in the offline hub cache (HF_HUB_CACHE): a snapshot copied from a saved folder."""
    sha = "0" * 40
    repo = root / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    shutil.rmtree(repo / "snapshots" / sha, ignore_errors=True)
    shutil.copytree(folder, repo / "snapshots" / sha)


def _prepared_dataset(root: Path, repo_id: str, config: str, splits: dict) -> None:
    """`load_dataset(repo_id, config)` offline: the datasets cache one earlier download leaves (as `_hub`'s glue),
    made from `splits` (split name -> a datasets.Dataset, its features kept through parquet)."""
    import glob
    import os

    from datasets import load_dataset

    name = repo_id.split("/")[-1]
    src_dir = root / "hub-src" / repo_id.replace("/", "+")
    shutil.rmtree(src_dir, ignore_errors=True)
    src_dir.mkdir(parents=True)
    files = {}
    for split, ds in splits.items():
        ds.to_parquet(str(src_dir / f"{split}.parquet"))
        files[split] = str(src_dir / f"{split}.parquet")
    load_dataset("parquet", data_files=files, cache_dir=str(src_dir / "prep"))
    src = next(p for p in glob.glob(str(src_dir / "prep" / "parquet" / "*" / "*" / "*")) if os.path.isdir(p))
    dst = root / "datasets-cache" / repo_id.replace("/", "___") / config / "0.0.0" / os.path.basename(src)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in os.listdir(src):
        if not f.endswith(".lock"):
            shutil.copy(os.path.join(src, f), dst / f.replace("parquet-", f"{name}-"))
    info = json.loads((dst / "dataset_info.json").read_text())
    info.update(config_name=config, builder_name=name, dataset_name=name)
    (dst / "dataset_info.json").write_text(json.dumps(info))


def _seq2seq_hub(root: Path) -> None:
    """peft's peft_adalora_seq2seq.py names its model and data: `facebook/bart-base` (a tiny BART with the llama-tiny
    tokenizer) and `zeroshot/twitter-financial-news-sentiment`, 1336 rows: the script's AdaLoRA schedule (tinit 200,
    tfinal 1000, 8 epochs of batch 8, all written in it) needs more than 1200 steps (151 batches of its 90% train split),
    or its first update_and_allocate masks with no rank pattern (AttributeError); its validation split must reach row 13."""
    import torch
    import transformers as tf
    from datasets import Dataset

    tok = tf.AutoTokenizer.from_pretrained(FIXTURES / "llama-tiny")
    torch.manual_seed(0)
    config = tf.BartConfig(vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           decoder_start_token_id=tok.eos_token_id, forced_eos_token_id=tok.eos_token_id)
    out = root / "models" / "bart-tiny"
    tf.BartForConditionalGeneration(config).save_pretrained(out)
    tok.save_pretrained(out)
    _hub_model(root, "facebook/bart-base", out)
    rows = _sentences(1336, 21)
    _prepared_dataset(root, "zeroshot/twitter-financial-news-sentiment", "default",
                      {"train": Dataset.from_dict({"text": rows, "label": [i % 3 for i in range(len(rows))]})})


def _wav(seconds: float, freq: float, seed: int) -> bytes:
    """16 kHz mono 16-bit PCM: a tone with a little noise (what a speech corpus's clip is, to a feature extractor)."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(16000 * seconds)) / 16000
    y = 0.3 * np.sin(2 * np.pi * freq * t) + 0.02 * np.random.default_rng(seed).standard_normal(t.size)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((y * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _speech(root: Path) -> None:
    """peft's Whisper AdaLoRA example: `whisper-tiny` and common_voice_11_0 "hi" (WAV bytes in an Audio column)."""
    from datasets import Audio, Dataset

    _whisper(root / "models" / "whisper-tiny")
    splits = {}
    for k, (split, n) in enumerate((("train", 12), ("validation", 4), ("test", 4))):
        text = _sentences(n, 30 + k)
        audio = [{"bytes": _wav(0.25 + 0.05 * (i % 4), 200.0 + 40 * i, i), "path": f"{split}-{i}.wav"} for i in range(n)]
        ds = Dataset.from_dict({"audio": audio, "sentence": text})
        splits[split] = ds.cast_column("audio", Audio(sampling_rate=16000))
    _prepared_dataset(root, "mozilla-foundation/common_voice_11_0", "hi", splits)


def _whisper(out: Path) -> None:
    """A tiny Whisper (8 mel bins, 1-second windows, one layer each side) and its processor: a byte-level
    WhisperTokenizer of the 256 byte symbols (no merges) with Whisper's special tokens, every language's among them."""
    import torch
    import transformers as tf
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{k}|>" for k in LANGUAGES), "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
    vocab.update({t: len(vocab) + i for i, t in enumerate(specials)})
    src = out.parent / "whisper-tiny-vocab"
    src.mkdir(parents=True, exist_ok=True)
    (src / "vocab.json").write_text(json.dumps(vocab))
    (src / "merges.txt").write_text("#version: 0.2\n")
    end = vocab["<|endoftext|>"]
    tok = tf.WhisperTokenizer(str(src / "vocab.json"), str(src / "merges.txt"), unk_token="<|endoftext|>",
                              bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    processor = tf.WhisperProcessor(feature_extractor=tf.WhisperFeatureExtractor(feature_size=8, chunk_length=1),
                                    tokenizer=tok)
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=len(vocab), num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                              decoder_ffn_dim=32, max_source_positions=50, max_target_positions=448, pad_token_id=end,
                              bos_token_id=end, eos_token_id=end, decoder_start_token_id=vocab["<|startoftranscript|>"])
    model = tf.WhisperForConditionalGeneration(config)
    gen = model.generation_config
    gen.lang_to_id = {f"<|{k}|>": vocab[f"<|{k}|>"] for k in LANGUAGES}
    gen.task_to_id = {"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]}
    gen.is_multilingual, gen.no_timestamps_token_id = True, vocab["<|notimestamps|>"]
    gen.max_length = 448
    model.save_pretrained(out)
    processor.save_pretrained(out)


def _images(folder: Path) -> None:
    from PIL import Image
    import numpy as np

    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (folder / "train" / label).mkdir(parents=True, exist_ok=True)
        (folder / "validation" / label).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            split = "train" if i < 4 else "validation"
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / split / label / f"{i}.png")


def _clip_tokenizer(folder: Path) -> object:
    """A character-level CLIPTokenizer (every letter, digit and stop, alone and word-final): CLIP's
    special tokens and 16-token prompts, with no merges to learn."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    vocab.update({"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=16)


def _sd_pipeline(out: Path) -> None:
    import torch
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = _clip_tokenizer(out.parent / "sd-tiny-vocab")
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16,
                                                bos_token_id=len(tokenizer) - 2, eos_token_id=len(tokenizer) - 1,
                                                pad_token_id=len(tokenizer) - 1))
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=2, norm_num_groups=4)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                        layers_per_block=1, norm_num_groups=4, sample_size=16)
    StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                            scheduler=DDPMScheduler(), safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(out)


def _captioned_images(folder: Path) -> None:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    captions = _sentences(8, seed=3)
    with (folder / "metadata.jsonl").open("w") as meta:
        for i, text in enumerate(captions):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i}.png")
            meta.write(json.dumps({"file_name": f"{i}.png", "text": text}) + "\n")


def _stubs(stubs: Path) -> None:
    here = Path(__file__).resolve().parent / "script_sweep_stubs"
    if stubs.exists():
        shutil.rmtree(stubs)
    # stubs/<name>/site-packages/<name>/: one PYTHONPATH entry per stand-in, in a folder named as an installed
    # package's is, so the doctor reads the stand-in as a library (a real torchvision's ToTensor is no user line)
    for package in here.iterdir():
        if package.is_dir() and package.name != "__pycache__":
            # a *_dist folder holds only a dist-info (the metadata of a package run from its checkout)
            to = stubs / package.name / "site-packages" / ("" if package.name.endswith("_dist") else package.name)
            shutil.copytree(package, to, ignore=shutil.ignore_patterns("__pycache__"))


if __name__ == "__main__":
    print(make_assets(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/script-sweep-assets")))
