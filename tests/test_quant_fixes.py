"""The quantization fixes: bnb-compute-dtype verified on a real 4-bit layer, and SetConfigKeyword on the user's
BitsAndBytesConfig(...) call (the edit both bnb strategies write)."""

import pytest
import torch
import torch.nn as nn

from dtype_doctor.fix.codemods import SetConfigKeyword

SCRIPT = '''import torch
from transformers import BitsAndBytesConfig

config = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
)
'''


def test_set_config_keyword_adds_and_replaces() -> None:
    added = SetConfigKeyword("bnb_4bit_compute_dtype", "bfloat16").apply(SCRIPT, "train.py")
    assert added.applied and "    bnb_4bit_compute_dtype=torch.bfloat16,\n)" in added.new_source
    replaced = SetConfigKeyword("bnb_4bit_compute_dtype", "float16").apply(added.new_source, "train.py")
    assert replaced.applied and replaced.new_source.count("bnb_4bit_compute_dtype") == 1
    assert "bnb_4bit_compute_dtype=torch.float16" in replaced.new_source
    no_torch = SetConfigKeyword("bnb_4bit_quant_storage", "bfloat16").apply("q = BitsAndBytesConfig(load_in_4bit=True)\n", "t.py")
    assert no_torch.new_source == "q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage='bfloat16')\n"


def test_set_config_keyword_keeps_a_multiline_call_and_names_the_calls_own_line() -> None:
    """A call spread over lines without a trailing comma gets its new argument on a line of its own, indented as
    the others; the detail names the call's line even where a comment above mentions the same call."""
    src = ("# BitsAndBytesConfig(load_in_8bit=True) is the one\nimport torch\ncfg = BitsAndBytesConfig(\n"
           "    load_in_8bit=True,\n    llm_int8_threshold=6.0\n)\n")
    result = SetConfigKeyword("llm_int8_enable_fp32_cpu_offload", "True").apply(src, "t.py")
    assert result.new_source.endswith("    llm_int8_threshold=6.0,\n    llm_int8_enable_fp32_cpu_offload=True\n)\n")
    assert "t.py:3" in result.detail
    scope: dict = {"BitsAndBytesConfig": dict}
    exec(result.new_source, scope)  # still Python, and the flag is set
    assert scope["cfg"]["llm_int8_enable_fp32_cpu_offload"] is True


def test_set_config_keyword_skips_what_it_cannot_place() -> None:
    assert SetConfigKeyword("bnb_4bit_compute_dtype", "float16").apply("x = 1\n", "t.py").status == "skipped"
    two = SCRIPT + "other = BitsAndBytesConfig(load_in_8bit=True)\n"
    assert SetConfigKeyword("bnb_4bit_compute_dtype", "float16").apply(two, "t.py").status == "skipped"


def test_the_edited_config_is_what_transformers_reads() -> None:
    pytest.importorskip("transformers")
    new = SetConfigKeyword("bnb_4bit_quant_storage", "bfloat16").apply(
        SetConfigKeyword("bnb_4bit_compute_dtype", "bfloat16").apply(SCRIPT, "t.py").new_source, "t.py").new_source
    scope: dict = {}
    exec(compile(new, "t.py", "exec"), scope)  # noqa: S102 - our own fixture text
    config = scope["config"]
    assert config.bnb_4bit_compute_dtype == torch.bfloat16 and config.bnb_4bit_quant_storage == torch.bfloat16


def test_bnb_compute_dtype_fix_is_verified_on_a_real_4bit_layer() -> None:
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
    from dtype_doctor.fix.engine import fix_model

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.proj = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=torch.float32).to("cpu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x)

    model, x = Net(), torch.randn(4, 64, dtype=torch.float16)
    result = fix_model(model, {"x": x}, fail_on="warning", measure=False)
    assert result.verified, result.report(None).fix
    assert [s.strategy for s in result.applied] == ["bnb-compute-dtype"]
    assert model.proj.compute_dtype == torch.float32  # the user's model is left as it was
    fixed = result.pipeline.model.proj
    assert fixed.compute_dtype == torch.float16 and fixed.weight.dtype == torch.uint8


def test_bnb_quant_storage_fix_is_verified_and_keeps_the_values() -> None:
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
    from dtype_doctor.fix.engine import fix_model

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.head = nn.Linear(64, 64).bfloat16().requires_grad_(False)
            self.proj = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16).to("cpu")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(self.head(x))

    model, x = Net(), torch.randn(2, 64, dtype=torch.bfloat16)
    result = fix_model(model, {"x": x}, strategy="bnb-quant-storage", fail_on="info", measure=False)
    assert result.verified and [s.strategy for s in result.applied] == ["bnb-quant-storage"]
    fixed = result.pipeline.model
    assert fixed.proj.weight.dtype == torch.bfloat16 and model.proj.weight.dtype == torch.uint8
    assert torch.equal(fixed(x), model(x))  # the same 4-bit values, in a bfloat16 container
