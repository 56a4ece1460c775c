"""load_model: real loads, simulated loads with fake tensors, and every refusal before anything runs.

Tiny models are built here from configs (config → model → save_pretrained) once per session.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from torch._subclasses.fake_tensor import FakeTensor

from dtype_doctor.machine.placement import Placement
from dtype_doctor.records.errors import InputError, PickleRefusedError, RemoteCodeError, UsageError
from dtype_doctor.load import LoadedModel, load_model

pytestmark = pytest.mark.filterwarnings("ignore")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "</s>", "a", "b", "c", "d", "e", "hello", "world"]


def make_tokenizer(eos: bool = False, pad: bool = True) -> transformers.PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    kw = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    if pad:
        kw["pad_token"] = "[PAD]"
    if eos:
        kw["eos_token"] = "</s>"
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, **kw)


def save(model: torch.nn.Module, path: Path, *side: object) -> Path:
    model.save_pretrained(path)
    for obj in side:
        obj.save_pretrained(path)  # type: ignore[attr-defined]
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    out: dict[str, Path] = {}
    bert_cfg = transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, num_labels=3,
    )
    out["bert"] = save(transformers.BertForSequenceClassification(bert_cfg), root / "bert", make_tokenizer())
    t5_cfg = transformers.T5Config(
        vocab_size=len(VOCAB), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=4,
    )
    out["t5"] = save(transformers.T5ForConditionalGeneration(t5_cfg), root / "t5")
    llama_cfg = transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )
    llama = transformers.LlamaForCausalLM(llama_cfg).to(torch.bfloat16)
    llama.config.dtype = torch.bfloat16
    out["llama-bf16"] = save(llama, root / "llama-bf16")
    vit_cfg = transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=2,
    )
    out["vit"] = save(
        transformers.ViTForImageClassification(vit_cfg), root / "vit",
        transformers.ViTImageProcessor(size={"height": 16, "width": 16}),
    )
    w2v_cfg = transformers.Wav2Vec2Config(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 8), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, num_labels=2, vocab_size=len(VOCAB),
    )
    out["wav2vec2"] = save(
        transformers.Wav2Vec2ForSequenceClassification(w2v_cfg), root / "wav2vec2",
        transformers.Wav2Vec2FeatureExtractor(),
    )
    return out


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def dtypes(model: torch.nn.Module) -> dict[str, torch.dtype]:
    d = {f"param:{n}": p.dtype for n, p in model.named_parameters()}
    d.update({f"buffer:{n}": b.dtype for n, b in model.named_buffers()})
    return d


# --------------------------------------------------------------------------- real loads


def test_real_load_of_a_local_directory(models: dict[str, Path]) -> None:
    lm = load_model(str(models["bert"]))
    assert isinstance(lm, LoadedModel)
    assert lm.class_name == "BertForSequenceClassification"
    assert lm.path == str(models["bert"].resolve())
    assert lm.dtype == "float32" and not lm.simulated and lm.fake_mode is None
    assert lm.weight_files == ("model.safetensors",)
    assert lm.model.training is False
    assert {"input_ids", "attention_mask", "token_type_ids", "labels"} <= set(lm.forward_params)
    assert "kwargs" not in lm.forward_params
    assert lm.tokenizer is not None and lm.image_processor is None and lm.feature_extractor is None
    assert lm.tokenizer("a b").input_ids == [5, 6]
    assert next(lm.model.parameters()).device.type == "cpu"


def test_dtype_float16_keeps_t5_wo_in_float32(models: dict[str, Path]) -> None:
    lm = load_model(str(models["t5"]), dtype="float16")
    params = dict(lm.model.named_parameters())
    assert params["encoder.block.0.layer.1.DenseReluDense.wo.weight"].dtype == torch.float32
    assert params["shared.weight"].dtype == torch.float16
    assert lm.dtype == "float16"
    # bfloat16 does not trigger _keep_in_fp32_modules (only _keep_in_fp32_modules_strict would)
    lm = load_model(str(models["t5"]), dtype="bfloat16")
    assert dict(lm.model.named_parameters())["encoder.block.0.layer.1.DenseReluDense.wo.weight"].dtype == torch.bfloat16


def test_dtype_auto_is_the_checkpoint_dtype_and_keeps_inv_freq_float32(models: dict[str, Path]) -> None:
    lm = load_model(str(models["llama-bf16"]))  # dtype="auto"
    assert lm.dtype == "bfloat16"
    assert dict(lm.model.named_buffers())["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert load_model(str(models["llama-bf16"]), dtype="float32").dtype == "float32"


def test_side_objects_image_processor_without_torchvision_and_feature_extractor(models: dict[str, Path]) -> None:
    assert importlib.util.find_spec("torchvision") is None  # the PIL backend must do
    vit = load_model(str(models["vit"]))
    assert vit.image_processor is not None and vit.tokenizer is None
    from PIL import Image

    out = vit.image_processor(Image.new("RGB", (20, 20)), return_tensors="pt")
    assert out["pixel_values"].shape == (1, 3, 16, 16) and out["pixel_values"].dtype == torch.float32
    w2v = load_model(str(models["wav2vec2"]))
    assert type(w2v.feature_extractor).__name__ == "Wav2Vec2FeatureExtractor" and w2v.image_processor is None


def test_processor_config_loads_the_processor_and_its_parts(models: dict[str, Path], tmp_path: Path) -> None:
    d = copy_model(models["wav2vec2"], tmp_path / "w2v-proc")
    os.remove(d / "preprocessor_config.json")
    transformers.Wav2Vec2Processor(
        feature_extractor=transformers.Wav2Vec2FeatureExtractor(), tokenizer=make_tokenizer()
    ).save_pretrained(d)
    assert (d / "processor_config.json").is_file()
    lm = load_model(str(d))
    assert type(lm.processor).__name__ == "Wav2Vec2Processor"
    assert lm.feature_extractor is lm.processor.feature_extractor
    assert lm.tokenizer is not None


def test_pickle_only_weights_are_refused_unless_allowed(models: dict[str, Path], tmp_path: Path) -> None:
    ref = load_model(str(models["bert"])).model.state_dict()
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(models["bert"] / "config.json", d)
    torch.save(ref, d / "pytorch_model.bin")
    with pytest.raises(PickleRefusedError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d.resolve()} has only pickled weights (pytorch_model.bin), which can run code when loaded; "
        "convert them to model.safetensors, or pass --allow-pickle to load them with torch.load(weights_only=True)"
    )
    lm = load_model(str(d), allow_pickle=True)
    assert torch.equal(lm.model.classifier.weight, ref["classifier.weight"])
    assert lm.weight_files == ("pytorch_model.bin",)
    # a bare state dict saved as *.pt next to config.json
    d2 = tmp_path / "pt"
    d2.mkdir()
    shutil.copy(models["bert"] / "config.json", d2)
    torch.save(ref, d2 / "weights.pt")
    with pytest.raises(PickleRefusedError):
        load_model(str(d2))
    lm2 = load_model(str(d2), allow_pickle=True, dtype="float16")
    assert lm2.dtype == "float16"
    assert torch.equal(lm2.model.classifier.weight, ref["classifier.weight"].half())
    # simulate reads no weights, so pickles are no risk there
    assert load_model(str(d), placement=Placement("cpu", simulated=True)).simulated


# --------------------------------------------------------------------------- simulate


@pytest.mark.parametrize(
    "name,dtype",
    [("t5", "float16"), ("t5", "bfloat16"), ("t5", "auto"), ("llama-bf16", "auto"), ("llama-bf16", "float16"),
     ("bert", "float16"), ("vit", "bfloat16"), ("wav2vec2", "float16")],
)
def test_simulate_gives_the_dtypes_a_real_load_gives(models: dict[str, Path], name: str, dtype: str) -> None:
    real = load_model(str(models[name]), dtype=dtype)
    sim = load_model(str(models[name]), dtype=dtype, placement=Placement("cuda:0", simulated=True))
    assert dtypes(sim.model) == dtypes(real.model)
    assert sim.dtype == real.dtype
    assert sim.simulated and sim.fake_mode is not None and sim.device == "cuda:0"
    for t in [*sim.model.parameters(), *sim.model.buffers()]:
        assert isinstance(t, FakeTensor)
        assert t.device == torch.device("cuda", 0)
        assert t.fake_mode is sim.fake_mode
    real_p = dict(real.model.named_parameters())
    for n, p in sim.model.named_parameters():
        assert p.shape == real_p[n].shape and p.requires_grad == real_p[n].requires_grad
    assert sim.model.training is False
    assert sim.forward_params == real.forward_params


def test_simulate_a_config_only_directory(models: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "t5-config-only"
    d.mkdir()
    shutil.copy(models["t5"] / "config.json", d)
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d.resolve()} has config.json but no weights (model.safetensors); pass --simulate to trace with fake tensors"
    )
    lm = load_model(str(d), placement=Placement("cuda:0", simulated=True), dtype="float16")
    p = dict(lm.model.named_parameters())
    wo = p["decoder.block.0.layer.2.DenseReluDense.wo.weight"]
    assert isinstance(wo, FakeTensor) and wo.device.type == "cuda" and wo.dtype == torch.float32
    assert p["shared.weight"].dtype == torch.float16
    assert lm.weight_files == ()
    # tied weights stay tied
    assert lm.model.lm_head.weight is lm.model.shared.weight
    # fake tensors can be moved and combined under the same mode
    with lm.fake_mode:
        x = torch.empty(2, 16, dtype=torch.float16, device="cuda:0")
        y = x.to(torch.float32)
    assert y.dtype == torch.float32 and y.device.type == "cuda"


def test_simulate_dtype_auto_without_dtype_in_config_reads_the_header(models: dict[str, Path], tmp_path: Path) -> None:
    d = copy_model(models["llama-bf16"], tmp_path / "llama-nodtype")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("dtype", None)
    cfg.pop("torch_dtype", None)
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(d)).dtype == "bfloat16"  # from_pretrained reads the weights' dtype
    assert load_model(str(d), placement=Placement("cpu", simulated=True)).dtype == "bfloat16"  # we read only the header
    os.remove(d / "model.safetensors")
    assert load_model(str(d), placement=Placement("cpu", simulated=True)).dtype == "float32"  # no weights: torch's default


def test_simulate_on_cpu_gives_cpu_fake_tensors(models: dict[str, Path]) -> None:
    lm = load_model(str(models["bert"]), placement=Placement("cpu", simulated=True))
    p = next(lm.model.parameters())
    assert isinstance(p, FakeTensor) and p.device.type == "cpu"


# --------------------------------------------------------------------------- refusals and bad input


def test_missing_path_and_uncached_hub_id(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(InputError) as e:
        load_model(missing)
    assert str(e.value) == f"{missing} is not a local directory and is not in the Hugging Face cache (no network is used)"
    with pytest.raises(InputError) as e:
        load_model("no-such-org/no-such-model-xyz")
    assert str(e.value) == (
        "no-such-org/no-such-model-xyz is not a local directory and is not in the Hugging Face cache (no network is used)"
    )


def test_a_file_instead_of_a_directory(models: dict[str, Path]) -> None:
    f = models["bert"] / "model.safetensors"
    with pytest.raises(InputError) as e:
        load_model(str(f))
    assert str(e.value) == f"{f} is a file; pass the model directory that holds config.json and the weights"


def test_config_json_problems(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d} has no config.json; pass a Hugging Face model directory (config.json + model.safetensors)"
    )
    (d / "config.json").write_text('{"model_type": "bert",\n "hidden_size": 16,,}')
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d / 'config.json'} is not valid JSON: Expecting property name enclosed in double quotes at line 2 "
        "column 20; fix or regenerate it"
    )
    (d / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f'{d / "config.json"} has no "architectures" entry, so the model class is unknown; '
        'add one, e.g. "architectures": ["BertForSequenceClassification"]'
    )
    (d / "config.json").write_text('{"model_type": "bert", "architectures": ["NoSuchModelForAnything"]}')
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d / 'config.json'}: architecture 'NoSuchModelForAnything' is not a class in transformers "
        f'{transformers.__version__} and config.json has no auto_map; fix "architectures" or upgrade transformers'
    )


MODELING = '''
import pathlib
pathlib.Path(MARKER_DIR, "IMPORTED").write_text("the repository's code ran")
import torch
from transformers import PreTrainedModel
from .configuration_tiny import TinyConfig


class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.lin = torch.nn.Linear(config.hidden, 2)
        self.post_init()

    def forward(self, input_values=None, labels=None):
        return self.lin(input_values)
'''

CONFIGURATION = '''
import pathlib
pathlib.Path(MARKER_DIR, "IMPORTED_CONFIG").write_text("the repository's code ran")
from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-custom-dd"

    def __init__(self, hidden=8, **kw):
        self.hidden = hidden
        super().__init__(**kw)
'''


def make_custom_code_model(d: Path) -> Path:
    from safetensors.torch import save_file

    d.mkdir()
    # transformers runs a copy from its modules cache: the markers go to an absolute path
    marker_dir = repr(str(d.resolve()))
    (d / "modeling_tiny.py").write_text(MODELING.replace("MARKER_DIR", marker_dir))
    (d / "configuration_tiny.py").write_text(CONFIGURATION.replace("MARKER_DIR", marker_dir))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["TinyModel"],
        "model_type": "tiny-custom-dd",
        "hidden": 8,
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"},
    }))
    save_file({"lin.weight": torch.ones(2, 8), "lin.bias": torch.zeros(2)}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    return d


def test_remote_code_is_refused_and_nothing_from_the_directory_runs(tmp_path: Path) -> None:
    d = make_custom_code_model(tmp_path / "custom")
    before = sorted(p.name for p in d.iterdir())
    for kw in ({}, {"placement": Placement("cpu", simulated=True)}, {"placement": Placement("cuda:0", simulated=True)}):
        with pytest.raises(RemoteCodeError) as e:
            load_model(str(d), **kw)
        assert str(e.value) == (
            f"{d.resolve()} needs code from the model repository (auto_map → modeling_tiny.py); "
            "pass --trust-remote-code to allow it"
        )
    assert not (d / "IMPORTED").exists() and not (d / "IMPORTED_CONFIG").exists()
    assert sorted(p.name for p in d.iterdir()) == before  # no __pycache__ either
    here = str(d.resolve())
    assert not any(here in str(getattr(m, "__file__", "") or "") for m in list(sys.modules.values()))


def test_remote_code_runs_when_trusted(tmp_path: Path) -> None:
    d = make_custom_code_model(tmp_path / "custom-trusted")
    lm = load_model(str(d), trust_remote_code=True)
    assert (d / "IMPORTED").exists() and (d / "IMPORTED_CONFIG").exists()
    assert lm.class_name == "TinyModel" and lm.forward_params == ("input_values", "labels")
    assert torch.equal(lm.model.lin.weight, torch.ones(2, 8))
    sim = load_model(str(d), trust_remote_code=True, placement=Placement("cuda:0", simulated=True), dtype="float16")
    assert isinstance(sim.model.lin.weight, FakeTensor) and sim.model.lin.weight.dtype == torch.float16


def test_tokenizer_with_remote_code_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    d = copy_model(models["bert"], tmp_path / "bert-custom-tok")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(RemoteCodeError) as e:
        load_model(str(d))
    assert str(e.value) == (
        f"{d.resolve() / 'tokenizer_config.json'} needs code from the model repository for its tokenizer "
        "(auto_map → tokenization_mine.py); pass --trust-remote-code to allow it"
    )


def test_truncated_or_garbage_safetensors(models: dict[str, Path], tmp_path: Path) -> None:
    d = copy_model(models["bert"], tmp_path / "trunc")
    f = d / "model.safetensors"
    with f.open("r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    for kw in ({}, {"placement": Placement("cpu", simulated=True)}):
        with pytest.raises(InputError) as e:
            load_model(str(d), **kw)
        assert str(e.value) == (
            f"{f.resolve()} is truncated or not a safetensors file: Error while deserializing header: "
            "incomplete metadata, file not fully covered; download or save it again"
        )
    f.write_bytes(b"this is not a safetensors file")
    with pytest.raises(InputError) as e:
        load_model(str(d))
    assert str(e.value).startswith(f"{f.resolve()} is truncated or not a safetensors file: Error while deserializing header")
    assert "\n" not in str(e.value)


def test_from_pretrained_errors_become_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    d = copy_model(models["t5"], tmp_path / "t5-wrong-config")
    cfg = json.loads((d / "config.json").read_text())
    cfg["d_model"] = 32  # the weights are 16 wide
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError) as e:
        load_model(str(d))
    msg = str(e.value)
    # transformers' own words ("look at the above report!") name nothing: the mismatched keys are named
    assert msg.startswith(
        f"{d.resolve()} could not be loaded as T5ForConditionalGeneration: the weights do not match config.json: "
    )
    assert "in the checkpoint" in msg and "more)" in msg
    assert "\n" not in msg


def test_bad_dtype_and_device(models: dict[str, Path]) -> None:
    with pytest.raises(UsageError) as e:
        load_model(str(models["bert"]), dtype="float64")
    assert str(e.value) == "dtype 'float64' is not one of auto, float32, float16, bfloat16"
    from dtype_doctor.pipeline import ScanOptions

    # the device is decided at the entry, before the loader runs: scan's options refuse it
    with pytest.raises(UsageError) as e:
        ScanOptions(device="gpu7").validate()
    assert str(e.value) == "unknown device 'gpu7'; use auto, cpu, cuda, cuda:N or mps"
    if not torch.cuda.is_available():
        with pytest.raises(UsageError) as e:
            ScanOptions(device="cuda").placement  # noqa: B018
        assert str(e.value) == (
            "device cuda:0 is not available here (torch.cuda.is_available() is False); "
            "pass --simulate (simulate=True) to trace for it with fake tensors"
        )


def test_hub_id_resolved_from_the_local_cache(models: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hc

    cache = tmp_path / "hub"
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--tiny-org--tiny-bert"
    shutil.copytree(models["bert"], repo / "snapshots" / sha)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    lm = load_model("tiny-org/tiny-bert")
    assert lm.class_name == "BertForSequenceClassification"
    assert lm.path == str(repo / "snapshots" / sha)
    assert lm.spec == "tiny-org/tiny-bert"


def test_importing_the_load_package_does_not_import_torch() -> None:
    code = (
        "import sys, dtype_doctor.load\n"
        "bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
