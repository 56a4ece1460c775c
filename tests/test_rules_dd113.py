"""DD113 default-dtype-changed and `target.loaded_dtype`: the dtype the model loaded in, and where it came from.

transformers first: a bf16 checkpoint loaded with no dtype comes back bf16 under transformers 5
(its default became dtype="auto", huggingface/transformers#42805); transformers 4 gave torch's
float32 for the same call, which dtype=torch.float32 still gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dtype_doctor.pipeline import ScanOptions, scan
from helpers_models import found, load_fixture

FIX = Path(__file__).resolve().parent.parent / "fixtures"
LM_TEXT = str(FIX / "data/lm-text")


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """llama-tiny saved in bfloat16, as most hub checkpoints are: config.json says "dtype": "bfloat16"."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("models") / "llama-bf16"
    load_fixture("llama-tiny").to(torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(FIX / "models/llama-tiny").save_pretrained(path)
    return str(path)


def test_transformers_5_loads_the_checkpoint_dtype_by_default(bf16_checkpoint: str) -> None:
    import transformers
    from transformers import AutoModelForCausalLM

    assert transformers.__version__.startswith("5.")
    assert AutoModelForCausalLM.from_pretrained(bf16_checkpoint).dtype == torch.bfloat16
    assert AutoModelForCausalLM.from_pretrained(bf16_checkpoint, dtype=torch.float32).dtype == torch.float32  # v4's default


def test_no_dtype_named_is_an_info_with_its_origin(bf16_checkpoint: str) -> None:
    report = scan(bf16_checkpoint, LM_TEXT, ScanOptions(train=True))
    loaded = report.to_dict()["target"]["loaded_dtype"]
    assert loaded == {"dtype": "bfloat16", "origin": "config", "asked": None, "config_dtype": "bfloat16",
                      "checkpoint_dtype": "bfloat16", "library": loaded["library"], "v4_dtype": "float32"}
    [f] = found(report, "DD113")
    assert f.severity == "info" and f.stage == "model-loading"
    assert "transformers 4 loaded float32" in f.message and "trains in bfloat16" in f.message
    assert found(report, "DD110")  # training in bf16: the consequence DD110 reports


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_named_dtype_is_the_users_argument(bf16_checkpoint: str, dtype: str) -> None:
    report = scan(bf16_checkpoint, LM_TEXT, ScanOptions(dtype=dtype))
    loaded = report.to_dict()["target"]["loaded_dtype"]
    assert (loaded["dtype"], loaded["origin"], loaded["asked"]) == (dtype, "argument", dtype)
    assert found(report, "DD113") == []


def test_inference_says_it_in_the_target_only(bf16_checkpoint: str) -> None:
    report = scan(bf16_checkpoint, LM_TEXT, ScanOptions())
    assert report.to_dict()["target"]["loaded_dtype"]["origin"] == "config"
    assert found(report, "DD113") == []


def test_a_float32_checkpoint_loads_as_v4_did() -> None:
    report = scan(str(FIX / "models/llama-tiny"), LM_TEXT, ScanOptions())
    assert report.to_dict()["target"]["loaded_dtype"]["origin"] == "config"
    assert found(report, "DD113") == []


def test_the_api_on_a_loaded_model_says_nothing_of_the_load() -> None:
    import dtype_doctor
    from helpers_models import token_batch

    report = dtype_doctor.diagnose(load_fixture("llama-tiny"), token_batch())
    assert "loaded_dtype" not in report.to_dict()["target"]
