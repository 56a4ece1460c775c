"""DD301 fp16-overflow-risk: forecast from fp32, inf in an fp16 trace, constants beyond a half dtype."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dtype_doctor
from helpers_errors import names_dtypes
from helpers_models import found, load_fixture


class Fill(nn.Module):
    """Attention-style scores masked with a constant, then used on."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.proj, self.value = nn.Linear(4, 4), value

    def forward(self, x, mask):
        scores = self.proj(x).masked_fill(mask, self.value)
        return scores.softmax(-1)


def batch(dtype=torch.float16):
    return {"x": torch.randn(2, 4, dtype=dtype), "mask": torch.tensor([[True, False, False, False]] * 2)}


@pytest.mark.parametrize("simulate", [False, True])
def test_a_minus_1e10_fill_into_fp16_scores(simulate):
    model, inputs = Fill(-1e10).half(), batch()
    with pytest.raises(RuntimeError) as err:  # what PyTorch itself does
        model(**inputs)
    assert names_dtypes(str(err.value), "float16")
    options = {"simulate": True, "device": "cuda"} if simulate else {}
    report = dtype_doctor.diagnose(model, inputs, **options)
    [f] = found(report, "DD301")
    assert (f.severity, f.module, f.op) == ("error", "", "aten.masked_fill.Scalar")
    assert "-1e+10" in f.message and "float16" in f.message
    assert not found(report, "DD100") and not found(report, "DD001")
    assert any(op.op == "aten._softmax.default" for op in report.trace.ops)  # the trace went on
    if not simulate:
        assert f.pytorch_error == str(err.value).splitlines()[0]


@pytest.mark.parametrize("value", [-1e4, float("-inf"), torch.finfo(torch.float16).min])
def test_fills_that_fit_or_mean_minus_inf_are_silent(value):
    model, inputs = Fill(value).half(), batch()
    model(**inputs)  # PyTorch accepts them
    assert not found(dtype_doctor.diagnose(model, inputs), "DD301")


def test_the_same_fill_into_bfloat16_fits():
    model, inputs = Fill(-1e10).bfloat16(), batch(torch.bfloat16)
    model(**inputs)
    assert not found(dtype_doctor.diagnose(model, inputs), "DD301")


class Write(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        logits = self.head(x)
        logits[..., 0] = float(2**30)  # silently inf in fp16
        return logits


def test_a_2_pow_30_write_into_fp16_logits_becomes_inf_silently():
    model, x = Write().half(), torch.randn(2, 4, dtype=torch.float16)
    out = model(x)  # no error from PyTorch ...
    assert torch.isinf(out[..., 0]).all()  # ... and inf in the logits
    [f] = found(dtype_doctor.diagnose(model, {"x": x}), "DD301")
    assert f.severity == "error" and "1.074e+09" in f.message and "inf" in f.message
    fp32 = Write()
    fp32(torch.randn(2, 4))
    assert not found(dtype_doctor.diagnose(fp32, {"x": torch.randn(2, 4)}), "DD301")


def test_torch_full_with_a_constant_beyond_fp16():
    class Full(nn.Module):
        def forward(self, x):
            return x + torch.full(x.shape, -1e9, dtype=x.dtype)

    x = torch.randn(2, 3, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        Full()(x)
    [f] = found(dtype_doctor.diagnose(Full(), {"x": x}), "DD301")
    assert f.op == "aten.full.default" and f.pytorch_error


class FFN(nn.Module):
    """A T5-style feed-forward block whose output can pass 65504."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wi, self.wo = nn.Linear(8, 32), nn.Linear(32, 8)
        with torch.no_grad():
            self.wo.weight.mul_(scale)

    def forward(self, x):
        return self.wo(torch.relu(self.wi(x)))


X = torch.randn(2, 8, generator=torch.Generator().manual_seed(1)) * 10


def test_forecast_from_fp32_and_the_inf_after_conversion():
    model = FFN(30000)
    with torch.no_grad():
        assert torch.isfinite(model(X)).all()
        assert torch.isinf(copy.deepcopy(model).half()(X.half())).any()  # plain .half() overflows
    [before] = found(dtype_doctor.diagnose(model, {"x": X}), "DD301")
    assert (before.severity, before.module, before.op) == ("warning", "wo", "aten.addmm.default")
    assert [r.strategy for r in before.remedies] == ["keep-fp32"]
    [after] = found(dtype_doctor.diagnose(copy.deepcopy(model).half(), {"x": X.half()}), "DD301")
    assert (after.severity, after.module) == ("error", "wo") and "gave inf" in after.message
    [amp] = found(dtype_doctor.diagnose(model, {"x": X}, autocast="float16"), "DD301")
    assert amp.module == "wo"


def test_within_the_margin_is_info_and_far_below_is_silent():
    peak = FFN(1.0)(X).abs().max().item()
    near = FFN(40000 / peak)  # peak ~40,000: inside 2× of 65504, still finite in fp16
    with torch.no_grad():
        assert torch.isfinite(copy.deepcopy(near).half()(X.half())).all()
    [f] = found(dtype_doctor.diagnose(near, {"x": X}), "DD301")
    assert f.severity == "info"
    assert not found(dtype_doctor.diagnose(FFN(1.0), {"x": X}), "DD301")
    assert not found(dtype_doctor.diagnose(FFN(1.0).half(), {"x": X.half()}), "DD301")


class KeptFFN(FFN):
    """T5's pattern: the model declares `wo` fp32 and casts what reaches it to wo's dtype."""

    _keep_in_fp32_modules = ["wo"]

    def forward(self, x):
        h = torch.relu(self.wi(x))
        return self.wo(h.to(self.wo.weight.dtype))


def test_a_kept_fp32_module_overflows_under_half_but_not_under_a_keeping_load():
    model = KeptFFN(30000)
    with torch.no_grad():
        halved = copy.deepcopy(model).half()  # the seeds' recipe: wo converted too
        assert torch.isinf(halved(X.half())).any()
        kept = copy.deepcopy(model).half()
        kept.wo.float()  # what from_pretrained(dtype=float16) does with _keep_in_fp32_modules
        assert kept.wo.weight.dtype == torch.float32 and kept.wi.weight.dtype == torch.float16
        assert torch.isfinite(kept(X.half())).all()
    [f] = found(dtype_doctor.diagnose(model, {"x": X}), "DD301")
    assert (f.severity, f.module) == ("warning", "wo")
    assert "model.half()" in f.message and "from_pretrained(dtype=torch.float16)" in f.message
    assert [r.strategy for r in f.remedies] == ["keep-fp32"]
    # Kept in float32 as declared, nothing overflows and nothing is reported.
    assert not found(dtype_doctor.diagnose(kept, {"x": X.half()}), "DD301")


def test_t5_overflow_fixture_before_and_after_conversion():
    fp32 = load_fixture("t5-overflow")
    ids = torch.tensor([[5, 6, 7, 1], [8, 9, 1, 0]])
    inputs = {"input_ids": ids, "decoder_input_ids": ids}
    with torch.no_grad():
        assert torch.isfinite(fp32(**inputs).logits).all()
        half = load_fixture("t5-overflow", dtype=torch.float16)  # wo kept in fp32 by transformers
        assert not torch.isfinite(half(**inputs).logits).all()
    [before] = found(dtype_doctor.diagnose(fp32, inputs), "DD301")
    assert before.severity == "warning" and before.module.endswith("DenseReluDense")
    assert "wo" not in before.module.split(".")  # the kept-fp32 wo itself is not blamed
    [after] = found(dtype_doctor.diagnose(half, inputs), "DD301")
    assert after.severity == "error" and after.module == before.module
    assert not found(dtype_doctor.diagnose(half, inputs), "DD303")  # DD301 already names the cause


def test_a_gelu_cube_that_tanh_absorbs_is_not_an_overflow():
    class Gelu(nn.Module):
        def forward(self, x):  # NewGELU: x³ overflows fp16 for |x| > 40, tanh(inf) = 1
            return 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * torch.pow(x, 3.0))))

    x = torch.tensor([[800.0, -800.0, 1.0]], dtype=torch.float16)
    assert torch.isfinite(Gelu()(x)).all()
    assert not found(dtype_doctor.diagnose(Gelu(), {"x": x}), "DD301")


class Adapted(nn.Module):
    """A frozen fp16 base with fp32 trainable adapters, the recommended AMP setup."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(16, 16).half().requires_grad_(False)
        self.adapter = nn.Linear(16, 16)

    def forward(self, x):
        h = self.base(x.half())
        return h.float() + self.adapter(h.float())


@pytest.mark.parametrize(
    "name, options",
    [("bert-tiny", {"autocast": "float16"}), ("llama-tiny", {"autocast": "float16", "train": True}),
     ("t5-tiny", {"dtype": torch.float16}), ("llama-tiny", {"dtype": torch.float16})],
)
def test_correct_half_setups_are_silent(name, options):
    model = load_fixture(name, **({"dtype": options["dtype"]} if "dtype" in options else {}))
    ids = torch.tensor([[5, 6, 7, 1], [8, 9, 1, 0]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    if name.startswith("t5"):
        inputs["decoder_input_ids"] = ids
    if options.get("train"):
        inputs["labels"] = ids
    trace_options = {k: v for k, v in options.items() if k != "dtype"}
    report = dtype_doctor.diagnose(model, inputs, **trace_options)
    assert report.trace.values_measured
    assert [f.code for f in report.findings if f.code.startswith("DD3")] == []


def test_fp32_adapters_on_a_half_base_are_silent():
    model, x = Adapted(), torch.randn(4, 16)
    report = dtype_doctor.diagnose(model, {"x": x}, train=True)
    assert [f.code for f in report.findings if f.code.startswith("DD3")] == []
