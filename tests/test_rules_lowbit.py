"""DD507-DD512 and DD125: MXFP4 checkpoints, MX/NVFP4 training recipes, requested against actual.

Each shows the real behaviour first: transformers' MXFP4 quantizer dequantizing on this CPU, its
loader leaving experts at random under the wrong config, torchao's MX casts refusing on this CPU.
What only the target hardware shows is checked against the source line of the check it mirrors,
read from the installed transformers and torchao, so an upgrade that moves them fails here.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from dtype_doctor.load.lowbit import header_keys, installed, keys_check, mxfp4_fallback
from dtype_doctor.pipeline import ScanOptions, scan
from dtype_doctor.records import ModelInfo, MxLinear, MxRecipe, Trace
from dtype_doctor.rules.dd512_mx_recipe_target import check as dd512
from tests.conftest import report_errors

transformers = pytest.importorskip("transformers")
LM_TEXT = "fixtures/data/text-pretok"
LLAMA = Path("fixtures/models/llama-tiny")
MX = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                          "model.embed_tokens", "lm_head"]}


def _quantizer_source() -> list[str]:
    import transformers.quantizers.quantizer_mxfp4 as q

    return Path(q.__file__).read_text().splitlines()


def _gptoss(root: Path, name: str, *, blocks: bool, config: bool) -> Path:
    """A tiny gpt-oss checkpoint (vocab of llama-tiny's tokenizer): bf16 experts, or MXFP4 blocks and
    scales as the real gpt-oss checkpoints hold them; with or without an mxfp4 quantization config."""
    from safetensors.torch import load_file, save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    out = root / name
    cfg = GptOssConfig(vocab_size=620, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                       max_position_embeddings=128, layer_types=["full_attention"])
    torch.manual_seed(0)
    GptOssForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((LLAMA / f).read_bytes())
    raw = json.loads((out / "config.json").read_text())
    raw.pop("quantization_config", None)
    if config:
        raw["quantization_config"] = MX
    (out / "config.json").write_text(json.dumps(raw))
    if blocks:
        sd = load_file(out / "model.safetensors")
        for k in [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            e, i, o = sd.pop(k).shape
            sd[k + "_blocks"] = torch.randint(0, 255, (e, o, i // 32, 16), dtype=torch.uint8)
            sd[k + "_scales"] = torch.full((e, o, i // 32), 127, dtype=torch.uint8)
        save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gptoss")
    return {"mxfp4": _gptoss(root, "mxfp4", blocks=True, config=True),
            "plain-under-mxfp4": _gptoss(root, "plain", blocks=False, config=True),
            "blocks-without-config": _gptoss(root, "blocks", blocks=True, config=False)}


def _codes(report) -> dict[str, str]:  # noqa: ANN001
    return {f.code: f.severity for f in report.findings}


# --- DD507: the dequantize-to-bf16 fallback ----------------------------------------------------

def test_transformers_dequantizes_mxfp4_on_this_cpu_and_dd507_names_why(checkpoints: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoints["mxfp4"])
    experts = model.model.layers[0].mlp.experts
    # the real fallback: plain bf16 experts, not Mxfp4GptOssExperts' blocks
    assert type(experts).__name__ == "GptOssExperts" and experts.gate_up_proj.dtype == torch.bfloat16
    report = scan(str(checkpoints["mxfp4"]), LM_TEXT, ScanOptions(train=True))
    [f] = [f for f in report.findings if f.code == "DD507"]
    triton, kernels = installed()
    assert "bfloat16 (dequantized)" in f.message and "quantizer_mxfp4.py:" in f.message
    assert ("Triton" in f.message) == (triton is None or triton < (3, 5))
    assert _codes(report)["DD125"] == "warning"  # the step trains in bf16, not the MXFP4 asked for
    assert "DD508" not in _codes(report)  # a bf16 model trains
    rows = report.to_dict()["requested"]
    assert {"setting": "quantization", "requested": "mxfp4", "actual": "bfloat16 (dequantized)"}.items() <= rows[1].items()
    assert report_errors(report.to_dict()) == []


@pytest.mark.parametrize("capability,triton,kernels,use_kernels,line,words", [
    ((7, 0), (3, 4), True, False, 95, "is_device_supported_mxfp4"),
    ((9, 0), None, True, False, 104, "triton_available"),
    ((10, 0), (3, 4), False, False, 113, "kernels_installed"),
    ((9, 0), (3, 4), True, True, 172, "use_kernels"),
    (None, (3, 5), True, False, 179, "use_kernels"),
])
def test_fallback_reasons_cite_the_quantizer_checks(capability, triton, kernels, use_kernels, line, words) -> None:  # noqa: ANN001
    fb = mxfp4_fallback(capability, triton=triton, kernels=kernels, use_kernels=use_kernels)
    assert fb is not None and fb.mirrors.endswith(f":{line}")
    assert words in _quantizer_source()[line - 1]  # the installed transformers' check at that line


def test_a_gpu_with_triton_and_kernels_keeps_mxfp4() -> None:
    assert mxfp4_fallback((7, 5), triton=(3, 4), kernels=True) is None
    assert mxfp4_fallback((10, 0), triton=(3, 3), kernels=True) is not None  # Triton too old


# --- DD508: training refused -------------------------------------------------------------------

def test_trainer_refuses_a_model_that_stays_mxfp4() -> None:
    # the check it mirrors: Trainer → validate_quantization_for_training → hf_quantizer.is_trainable (False for MXFP4)
    import transformers.trainer_utils as tu
    from transformers.quantizers.quantizer_mxfp4 import Mxfp4HfQuantizer

    assert Mxfp4HfQuantizer.is_trainable.fget(object.__new__(Mxfp4HfQuantizer)) is False
    assert "that quantization method do not support training" in Path(tu.__file__).read_text()
    from dtype_doctor.records import LoadFacts, LowBit
    from dtype_doctor.rules.dd508_mxfp4_training_refused import check

    facts = LoadFacts("bfloat16", "config", lowbit=LowBit("mxfp4"))
    trace = Trace((), (), ModelInfo("GptOssForCausalLM", ()), (), device="cuda:0", simulated=True, train=True,
                  gpu="h100 (compute capability 9.0)", gpu_capability=(9, 0), loaded=facts)
    [f] = list(check(trace))
    assert f.severity == "error" and "refuses" in f.message
    assert list(check(Trace((), (), ModelInfo("M", ()), (), train=False, loaded=facts))) == []  # inference runs


# --- DD509: the quantization config against the checkpoint's keys -------------------------------

def test_blocks_without_an_mxfp4_config_load_random_experts(checkpoints: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(checkpoints["blocks-without-config"], output_loading_info=True)
    assert any(k.endswith("experts.gate_up_proj") for k in info["missing_keys"])  # initialised at random
    report = scan(str(checkpoints["blocks-without-config"]), LM_TEXT, ScanOptions())
    [f] = [f for f in report.findings if f.code == "DD509"]
    assert f.severity == "error" and "experts.gate_up_proj" in f.message


def test_plain_weights_under_mxfp4_and_a_matching_checkpoint(checkpoints: dict[str, Path]) -> None:
    _, keys = header_keys(checkpoints["plain-under-mxfp4"])
    found = keys_check("mxfp4", keys, "model.safetensors")
    assert found is not None and all(k.endswith("_blocks") for k in found.expected) and found.missing == 2
    assert keys_check("mxfp4", header_keys(checkpoints["mxfp4"])[1], "x") is None
    assert keys_check(None, header_keys(LLAMA)[1], "x") is None  # no expert weights: nothing to say
    src = "\n".join(_quantizer_source())
    assert '"gate_up_proj": ["gate_up_proj_blocks", "gate_up_proj_scales"]' in src  # serialized_names


# --- DD510 / DD511: torchao's MX casts, refused on this CPU as on a B200 ------------------------

def _mx_model(k: int, dtype: torch.dtype) -> nn.Module:
    pytest.importorskip("torchao")
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    model = nn.Sequential(nn.Linear(k, 64, bias=False)).to(dtype)
    quantize_(model, MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED),
              filter_fn=lambda m, fqn: isinstance(m, nn.Linear))
    return model


@pytest.mark.parametrize("k,dtype,code", [(40, torch.bfloat16, "DD510"), (64, torch.float16, "DD511"),
                                          (64, torch.bfloat16, None), (64, torch.float32, None)])
def test_mx_training_casts(k: int, dtype: torch.dtype, code: str | None) -> None:
    model, x = _mx_model(k, dtype), torch.randn(32, k, dtype=dtype)
    if code is not None:
        with pytest.raises(AssertionError):  # torchao's to_mx: block size, or bf16/float32 only
            model(x).sum().backward()
    report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    codes = _codes(report)
    assert {c for c in codes if c in ("DD510", "DD511")} == ({code} if code else set())
    assert "DD001" not in codes  # the failure is the rule's, named


def test_tokens_must_divide_too_in_training() -> None:
    model = _mx_model(64, torch.bfloat16)
    with pytest.raises(AssertionError):  # the weight's gradient scales x.t(): 8 tokens in the last dimension
        model(torch.randn(8, 64, dtype=torch.bfloat16)).sum().backward()
    report = dtype_doctor.diagnose(model, {"input": torch.randn(8, 64, dtype=torch.bfloat16)}, train=True)
    [f] = [f for f in report.findings if f.code == "DD510"]
    assert "tokens in the step 8" in f.message


# --- DD512: the recipe's target ------------------------------------------------------------------

def _recipe_trace(capability, *, emulated=False, grad="e4m3") -> Trace:  # noqa: ANN001
    linear = MxLinear("proj", "Linear", 64, 64, "mxfp8", "bfloat16")
    recipe = MxRecipe("torchao", "mxfp8", grad_format=grad, emulated=emulated, linears=(linear,))
    return Trace((), (), ModelInfo("M", (), mx_recipe=recipe), (), device="cuda:0", simulated=True, train=True,
                 gpu=f"sm_{capability}", gpu_capability=capability)


def test_mx_recipes_need_capability_10() -> None:
    pytest.importorskip("torchao")
    import torchao.prototype.mx_formats.kernels as k
    from torchao.utils import is_sm_at_least_100

    assert "is_sm_at_least_100()" in Path(k.__file__).read_text()  # the guard of the MX kernels
    assert ">= (10, 0)" in inspect.getsource(is_sm_at_least_100)
    assert [f.code for f in dd512(_recipe_trace((9, 0)))] == ["DD512"]
    assert list(dd512(_recipe_trace((10, 0)))) == []
    assert list(dd512(_recipe_trace((9, 0), emulated=True))) == []  # EMULATED runs anywhere
    assert "E5M2" in next(iter(dd512(_recipe_trace((10, 0), grad="e5m2")))).message


# --- requested against actual: a clean model has no fallback ------------------------------------

def test_a_plain_model_ran_as_asked() -> None:
    report = scan(str(LLAMA), LM_TEXT, ScanOptions(dtype="float32", autocast="bfloat16", train=True))
    rows = report.to_dict()["requested"]
    assert [r["setting"] for r in rows] == ["dtype", "autocast"]
    assert all(r["fallback"] is None for r in rows) and rows[1]["actual"] == "autocast(bfloat16)"
    assert "DD125" not in _codes(report) and report_errors(report.to_dict()) == []


def test_a_broken_header_is_left_to_the_loader(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8 + b"garbage")
    (tmp_path / "b.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]")
    assert header_keys(tmp_path)[1] == ()


# --- compare: the MXFP8 row, emulated on this CPU ------------------------------------------------

def test_compare_gains_an_mxfp8_row() -> None:
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 40))  # the last Linear: 40 is no multiple of 32
    table = dtype_doctor.compare(model, {"input": torch.randn(32, 64)}, variants=["mxfp8", "bfloat16"], repeat=1, warmup=0)
    mx, bf16 = table.row("mxfp8"), table.row("bfloat16")
    assert mx.failure is None and "1 Linear layers MXFP8" in mx.note and "1 left bfloat16" in mx.note
    # MXFP8's rounding (3 mantissa bits in blocks of 32) is coarser than bfloat16's 7: a larger error, not none
    assert mx.output.max_abs > bf16.output.max_abs > 0


# --- run: the script's own from_pretrained, on a simulated GPU ------------------------------------

SCRIPT = """import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 620, (2, 16)).to("cuda")
model.to("cuda")(input_ids=ids, labels=ids).loss.backward()
opt.step()
"""


def test_run_reads_what_the_scripts_load_made_of_mxfp4(checkpoints: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    from helpers_cli import run_json

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, report, err = run_json(["run", "--simulate", "--gpu", "v100", "--format", "json", "--",
                                  "python", str(script), str(checkpoints["mxfp4"])], capsys)
    assert report is not None, err
    [f] = [f for f in report["findings"] if f["code"] == "DD507"]
    assert "compute capability >= 7.5" in f["message"] and f["message"].endswith("quantizer_mxfp4.py:95)")
    assert any(f["code"] == "DD125" for f in report["findings"]) and report_errors(report) == []


def test_nvfp4_blocks_are_16() -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

    from dtype_doctor.records import ModuleCall, TensorMeta
    from dtype_doctor.rules.dd510_mx_block_size_divisibility import check

    with pytest.raises(AssertionError):  # torchao: "K dim must be divisible by block_size"
        nvfp4_quantize(torch.randn(32, 40, dtype=torch.bfloat16), block_size=16)
    nvfp4_quantize(torch.randn(32, 48, dtype=torch.bfloat16), block_size=16)  # 48: a multiple of 16, not of 32

    def trace(k: int) -> Trace:
        x = TensorMeta("bfloat16", "cpu", (32, k), "input", "input")
        recipe = MxRecipe("torchao", "nvfp4", linears=(MxLinear("proj", "Linear", k, 64, "nvfp4", "bfloat16"),))
        call = ModuleCall("proj", "Linear", (x,), ())
        return Trace((), (call,), ModelInfo("M", (), mx_recipe=recipe), (x,), train=True)

    assert "block of 16" in next(iter(check(trace(40)))).message
    assert list(check(trace(48))) == []


def test_a_simulated_hopper_is_told_the_recipe_needs_blackwell() -> None:
    pytest.importorskip("torchao")
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
    from torchao.quantization import quantize_

    model = nn.Sequential(nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    quantize_(model, MXFP8TrainingOpConfig(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear))  # KernelPreference.AUTO
    x = {"input": torch.randn(32, 64, dtype=torch.bfloat16)}
    hopper = dtype_doctor.diagnose(model, x, train=True, device="cuda", simulate=True, gpu="h100")
    blackwell = dtype_doctor.diagnose(model, x, train=True, device="cuda", simulate=True, gpu="b200")
    assert _codes(hopper).get("DD512") == "error" and "DD512" not in _codes(blackwell)
