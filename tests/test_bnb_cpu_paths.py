"""bitsandbytes chooses its CPU path for a 4-bit Linear at run time, and a trace takes the path the
plain call takes and leaves the weight as it found it.

On a CPU with avx512_bf16 (bitsandbytes' `has_avx512bf16()`: Intel Cooper Lake / Sapphire Rapids
and later, AMD Zen 4), an eval forward whose input needs no grad packs the weight for a fused
kernel: `Linear4bit.forward` rewrites `weight.data` and its QuantState in place
(`_convert_weight_packed_for_cpu`). With grad, in training, or on other CPUs it dequantizes. The
doctor once traced every forward under its own `torch.no_grad()`, which sent the trace down the
packing path where the plain `model(**batch)` does not go; for llama-tiny, whose hidden size (32)
is below the quantization block (64), that path fails in bitsandbytes itself ("shape '[32, 0]' is
invalid"), and the scan reported a DD001 for a step that runs. Each test forces each path it can
(the dequantizing one anywhere; the packing one where the CPU has the instructions) and shows
the plain call first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dtype_doctor

bnb = pytest.importorskip("bitsandbytes")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PACKS = bool(bnb.functional.has_avx512bf16())


@pytest.fixture(params=["packed", "dequantized"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "packed" and not PACKS:
        pytest.skip("this CPU has no avx512_bf16: bitsandbytes never takes its packed CPU path here")
    if request.param == "dequantized":
        monkeypatch.setattr(bnb.nn.modules, "has_avx512bf16", lambda: False)  # read by Linear4bit.__init__
    return request.param


def _layer() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="fp4").to("cpu")
    return torch.nn.Sequential(layer).requires_grad_(False)


def _packed(model: torch.nn.Module) -> bool:
    return any(getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False) for m in model.modules()
               if isinstance(m, bnb.nn.Linear4bit))


def test_a_traced_eval_forward_leaves_the_4bit_weight_as_it_was(path: str) -> None:
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    plain = _layer().eval()
    with torch.no_grad():
        plain(x)
    assert _packed(plain) == (path == "packed")  # the plain call: bitsandbytes' own choice on this CPU
    model = _layer()
    weight = model[0].weight
    data, absmax, dtype = weight.data, weight.quant_state.absmax, weight.dtype
    with torch.no_grad():
        report = dtype_doctor.diagnose(model, {"input": x})
    assert "DD001" not in {f.code for f in report.findings}
    # Packed or not during the step, the model is handed back as it came: data, dtype, QuantState.
    assert not _packed(model) and weight.data.data_ptr() == data.data_ptr() and weight.dtype == dtype
    assert weight.quant_state.absmax is absmax
    assert model.train()(x).shape == (2, 64)  # and it still runs the training path


def _llama(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4")
    return AutoModelForCausalLM.from_pretrained(FIXTURES / "models" / "llama-tiny", quantization_config=quant, dtype=torch.float16)


def test_the_issue_scan_reports_what_the_plain_forward_does(path: str, capsys: pytest.CaptureFixture) -> None:
    """`scan llama-tiny lm-text --load-in-4bit --bnb-quant-type fp4 --dtype float16`: the plain forward
    (grad on, as a script runs it) dequantizes on every CPU and runs; so does the scan's trace."""
    ids = torch.randint(5, 100, (2, 8))
    _llama(path)(input_ids=ids)  # the plain call runs
    from dtype_doctor.cli.main import run

    with pytest.raises(SystemExit):
        run(["scan", str(FIXTURES / "models" / "llama-tiny"), str(FIXTURES / "data" / "lm-text"), "--load-in-4bit",
             "--bnb-quant-type", "fp4", "--dtype", "float16", "-f", "json"])
    report = json.loads(capsys.readouterr().out)
    assert "DD001" not in {f["code"] for f in report["findings"]} and "trace_failure" not in report
    if path == "packed":
        # Under the caller's own no_grad the plain call packs, and bitsandbytes fails for this tiny hidden size:
        # a trace made there says so, as the plain call does.
        with torch.no_grad(), pytest.raises(RuntimeError, match=r"shape '\[32, 0\]' is invalid"):
            _llama(path)(input_ids=ids)
        with torch.no_grad():
            traced = dtype_doctor.diagnose(_llama(path), {"input_ids": ids})
        assert "shape '[32, 0]' is invalid" in traced.trace.failure.message
