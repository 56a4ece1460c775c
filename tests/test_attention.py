"""Attention kernels: flash-attn asked for where it cannot run (DD701, DD702), and the SDPA backend
CUDA would pick (`target.attention`), from torch's own filters in sdp_utils.cpp.

transformers first: asking a Llama for flash_attention_2 on this machine fails at from_pretrained
(no flash_attn, no GPU); on a GPU with flash_attn, float32 weights fail at the first forward with
flash-attn's "FlashAttention only support fp16 and bf16 data type" and a T4 with "FlashAttention
only supports Ampere GPUs or newer." (csrc/flash_attn/flash_api.cpp). The doctor says so before
the load, and traces the rest of the model with SDPA in flash-attn's place.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from dtype_doctor.ops.sdpa import SdpaCall, cuda_backend
from dtype_doctor.pipeline import ScanOptions, scan
from dtype_doctor.records import TensorMeta

FIX = Path(__file__).resolve().parent.parent / "fixtures"
LM_TEXT = str(FIX / "data/lm-text")
HAS_FLASH = importlib.util.find_spec("flash_attn") is not None


@pytest.fixture(scope="module")
def llama_flash(tmp_path_factory: pytest.TempPathFactory) -> str:
    """llama-tiny (float32) whose config.json asks for flash_attention_2."""
    path = tmp_path_factory.mktemp("models") / "llama-flash"
    shutil.copytree(FIX / "models/llama-tiny", path)
    config = json.loads((path / "config.json").read_text())
    config["attn_implementation"] = "flash_attention_2"
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return str(path)


@pytest.mark.skipif(HAS_FLASH, reason="flash_attn is installed: the load would get past the package check")
def test_transformers_refuses_flash_attention_here(llama_flash: str) -> None:
    from transformers import AutoModelForCausalLM

    with pytest.raises(ImportError):
        AutoModelForCausalLM.from_pretrained(llama_flash)


def _codes(report, severity: str = "error") -> list[str]:
    return [f.code for f in report.findings if f.severity == severity]


def test_float32_weights_with_flash_attention_on_an_a100(llama_flash: str) -> None:
    report = scan(llama_flash, LM_TEXT, ScanOptions(simulate=True, device="cuda", gpu="a100"))
    assert _codes(report) == ["DD701"]
    [f] = [f for f in report.findings if f.code == "DD701"]
    assert f.pytorch_error == "FlashAttention only support fp16 and bf16 data type"
    assert f.stage == "model-loading" and f.module == "model.layers.0.self_attn"
    assert {r.strategy for r in f.remedies} == {"autocast"}
    attention = report.to_dict()["target"]["attention"]
    assert (attention["implementation"], attention["origin"], attention["traced_as"]) == ("flash_attention_2", "config", "sdpa")
    # the same model in bf16 is fine on an A100
    assert _codes(scan(llama_flash, LM_TEXT, ScanOptions(simulate=True, device="cuda", gpu="a100", dtype="bfloat16"))) == []


def test_flash_attention_on_a_t4(llama_flash: str) -> None:
    report = scan(llama_flash, LM_TEXT, ScanOptions(simulate=True, device="cuda", gpu="t4", dtype="float16"))
    assert _codes(report) == ["DD702"]
    [f] = [f for f in report.findings if f.code == "DD702"]
    assert f.pytorch_error == "FlashAttention only supports Ampere GPUs or newer."
    assert "7.5" in f.message


def test_flash_attention_on_the_cpu(llama_flash: str) -> None:
    assert sorted(_codes(scan(llama_flash, LM_TEXT, ScanOptions(device="cpu")))) == ["DD701", "DD702"]


@pytest.mark.parametrize(("gpu", "dtype", "backend"), [
    ("a100", "bfloat16", "efficient"),  # a padding mask: flash takes none
    ("a100", "float32", "efficient"),
    ("t4", "float16", "efficient"),
    ("t4", "bfloat16", "math"),  # memory-efficient takes bf16 from sm80 only
])
def test_sdpa_backend_in_the_report(gpu: str, dtype: str, backend: str) -> None:
    report = scan(str(FIX / "models/llama-tiny"), LM_TEXT, ScanOptions(simulate=True, device="cuda", gpu=gpu, dtype=dtype))
    attention = report.to_dict()["target"]["attention"]
    assert attention["implementation"] == "sdpa" and attention["traced_as"] is None
    assert attention["sdpa_backend"] == backend, attention
    assert [r["dtype"] for r in attention["sdpa"]] == [dtype]


def test_cpu_trace_names_no_cuda_backend() -> None:
    attention = scan(str(FIX / "models/llama-tiny"), LM_TEXT, ScanOptions(device="cpu")).to_dict()["target"]["attention"]
    assert attention["sdpa_backend"] is None and "--gpu" in attention["why"]


def _call(dtype: str = "bfloat16", head_dim: int = 64, *, q_len: int = 128, k_len: int = 128, heads: tuple[int, int] = (8, 8),
          mask: bool = False, causal: bool = False, grad: bool = False, dropout: float = 0.0) -> SdpaCall:
    q = TensorMeta(dtype, "cuda:0", (2, heads[0], q_len, head_dim))
    k = TensorMeta(dtype, "cuda:0", (2, heads[1], k_len, head_dim), "input")
    m = TensorMeta("bool", "cuda:0", (2, 1, q_len, k_len), "mask") if mask else None
    return SdpaCall(q, k, k, m, dropout, causal, False, grad)


@pytest.mark.parametrize(("call", "cc", "backend", "because"), [
    (_call(), (8, 0), "flash", "filters pass"),
    (_call(), (9, 0), "flash", "filters pass"),
    (_call(mask=True), (8, 0), "efficient", "attn_mask"),
    (_call("float32"), (8, 0), "efficient", "float32"),
    (_call("float16"), (7, 5), "efficient", "compute capability 7.5"),
    (_call("bfloat16"), (7, 0), "math", "bfloat16"),  # V100: no bf16 in memory-efficient before sm80
    (_call(head_dim=512), (8, 0), "efficient", "at most 256"),  # flash: <= 256; memory-efficient has no such limit on CUDA
    (_call(head_dim=60), (8, 0), "flash", "filters pass"),  # flash pads any head dim up to 256
    (_call(head_dim=60, mask=True), (8, 0), "math", "multiples of 8"),  # memory-efficient wants bf16 rows of 8
    (_call("float32", head_dim=60, mask=True), (8, 0), "efficient", "attn_mask"),  # float32 rows align on 4
    (_call(causal=True, q_len=1, k_len=128), (8, 0), "efficient", "different lengths"),
    (_call(head_dim=200, grad=True), (8, 6), "efficient", "training with head dim 200"),
    (_call(head_dim=200, grad=True), (8, 0), "flash", "filters pass"),  # the sm86-89 limit is not an A100's
    (_call(heads=(8, 2)), (8, 0), "math", "head count"),  # grouped heads need enable_gqa
])
def test_backend_choice_follows_sdp_utils(call: SdpaCall, cc: tuple[int, int], backend: str, because: str) -> None:
    choice = cuda_backend(call, cc)
    assert choice.backend == backend and because in choice.why, choice
