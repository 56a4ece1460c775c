"""DD101 dtype-mismatch-in-op: operands of different dtypes meet in an op that needs one dtype.

Every case shows the plain PyTorch call next to the doctor's finding: where the rule says
the op fails, the plain call raises; where PyTorch accepts a mix, the plain call runs and
the doctor says nothing.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from helpers_errors import names_dtypes, raises_dtype_error
from helpers_models import found, load_fixture, located

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


class One(nn.Module):
    """Wraps one layer under a dotted name, so findings can be checked by module."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.block = nn.Module()
        self.block.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block.layer(x)


def only_dd101(report) -> "dtype_doctor.Finding":
    hits = found(report, "DD101")
    assert len(hits) == 1, [(f.module, f.op, f.message) for f in report.findings]
    return hits[0]


# ----------------------------------------------------------------- matmul and conv


@pytest.mark.parametrize(
    "layer_dtype,input_dtype,bias,op",
    [
        (F16, F32, True, "aten.addmm.default"),  # half model, fp32 batch
        (F32, F16, True, "aten.addmm.default"),  # the reverse: half batch into an fp32 model
        (BF16, F32, False, "aten.mm.default"),
        (F32, F64, True, "aten.addmm.default"),  # numpy float64 features
    ],
)
def test_linear_fed_another_dtype(layer_dtype, input_dtype, bias, op):
    model = One(nn.Linear(8, 4, bias=bias).to(layer_dtype))
    x = torch.randn(3, 8, dtype=input_dtype)
    with pytest.raises(RuntimeError, match="to have the same dtype|must have the same dtype") as real:
        model(x)

    report = dtype_doctor.diagnose(model, {"x": x})
    f = only_dd101(report)
    assert (f.severity, f.module, f.module_type, f.op) == ("error", "block.layer", "Linear", op)
    assert f.stage == "collator"  # an API call: the caller built the batch
    assert f.pytorch_error == str(real.value).splitlines()[0]
    by_role = {t.role: t for t in f.tensors}
    assert by_role["input"].name == "x" and by_role["input"].dtype == str(input_dtype).removeprefix("torch.")
    assert by_role["weight"].name == "block.layer.weight"
    assert by_role["weight"].dtype == str(layer_dtype).removeprefix("torch.")
    assert "x" in f.message and str(layer_dtype).removeprefix("torch.") in f.message
    assert report.trace.failure is None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("conv,shape", [(nn.Conv1d(3, 4, 3), (2, 3, 10)), (nn.Conv2d(3, 4, 3), (2, 3, 8, 8))])
@pytest.mark.parametrize("layer_dtype,input_dtype", [(F16, F32), (F32, F16), (F32, F64)])
def test_conv_fed_another_dtype(conv, shape, layer_dtype, input_dtype):
    model = One(conv.to(layer_dtype))
    x = torch.randn(*shape, dtype=input_dtype)
    with raises_dtype_error(_name(layer_dtype), _name(input_dtype)):
        model(x)

    f = only_dd101(dtype_doctor.diagnose(model, {"x": x}))  # one finding though seen at two levels
    assert (f.module, f.module_type, f.severity) == ("block.layer", type(conv).__name__, "error")
    assert f.op in ("aten.convolution.default", f"torch.{type(conv).__name__.lower()}")
    assert f.stage == "collator"


def test_integer_activation_into_conv_is_a_mismatch():
    """uint8 pixels straight into a float conv: PyTorch rejects it like a second float dtype."""
    model = One(nn.Conv2d(3, 4, 3))
    x = torch.randint(0, 255, (1, 3, 8, 8), dtype=torch.uint8)
    with raises_dtype_error("uint8", "float32"):
        model(x)
    for simulate in (False, True):
        f = only_dd101(dtype_doctor.diagnose(model, {"x": x}, simulate=simulate, device="cpu"))
        assert (f.module, f.severity) == ("block.layer", "error")
        assert "uint8" in f.message


def test_integer_activation_into_linear_is_a_mismatch():
    model = One(nn.Linear(4, 4))
    x = torch.ones(2, 4, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="must have the same dtype, but got Long and Float"):
        model(x)
    for simulate in (False, True):
        f = only_dd101(dtype_doctor.diagnose(model, {"x": x}, simulate=simulate, device="cpu"))
        assert (f.module, f.op) == ("block.layer", "aten.addmm.default")


def test_trace_goes_on_after_an_integer_activation():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 4, 1)
            self.head = nn.Linear(5, 2).half()

        def forward(self, x):
            return self.head(self.conv(x))

    report = dtype_doctor.diagnose(Two(), {"x": torch.ones(1, 3, 5, dtype=torch.uint8)})
    assert report.trace.failure is None
    assert located(report, {"DD101"}) == {("DD101", "conv"), ("DD101", "head")}


# --------------------------------------------------------------------------- norms

NORMS = [
    ("LayerNorm", lambda: nn.LayerNorm(8), (2, 4, 8), "aten.native_layer_norm.default"),
    ("GroupNorm", lambda: nn.GroupNorm(2, 4), (2, 4, 8), "aten.native_group_norm.default"),
    ("BatchNorm1d", lambda: nn.BatchNorm1d(4), (2, 4, 8), "aten.native_batch_norm.default"),
]


@pytest.mark.parametrize("name,make,shape,op", NORMS, ids=[n[0] for n in NORMS])
@pytest.mark.parametrize("param_dtype,input_dtype", [(F16, F32), (BF16, F32), (F32, F64), (BF16, F16)])
def test_norm_with_other_params_rejects_input(name, make, shape, op, param_dtype, input_dtype):
    model = One(make().to(param_dtype)).eval()
    x = torch.randn(*shape, dtype=input_dtype)
    with pytest.raises(RuntimeError, match="mixed dtype"):
        model(x)
    f = only_dd101(dtype_doctor.diagnose(model, {"x": x}))
    assert (f.module, f.module_type, f.op, f.severity) == ("block.layer", name, op, "error")


@pytest.mark.parametrize("name,make,shape,op", NORMS, ids=[n[0] for n in NORMS])
@pytest.mark.parametrize("input_dtype", [F16, BF16])
@pytest.mark.parametrize("train", [False, True])
def test_half_input_into_fp32_norm_is_accepted(name, make, shape, op, input_dtype, train):
    """PyTorch has mixed-type norm kernels: half input with fp32 affine params runs."""
    model = One(make()).train(train)
    x = torch.randn(*shape, dtype=input_dtype)
    out = model(x)
    assert out.dtype == input_dtype
    report = dtype_doctor.diagnose(model, {"x": x}, train=train)
    assert report.findings == ()
    assert any(op == o.op for o in report.trace.ops)  # the norm really was traced


# ---------------------------------------------------------------- attention, index_put


class Attention(nn.Module):
    def forward(self, q, kv):
        return F.scaled_dot_product_attention(q, kv, kv)


def test_sdpa_query_key_dtype_mismatch():
    q, kv = torch.randn(1, 2, 4, 8, dtype=F16), torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q, kv, kv)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

        def forward(self, q, kv):
            return self.attn(q, kv)

    f = only_dd101(dtype_doctor.diagnose(Wrap(), {"q": q, "kv": kv}))
    assert (f.module, f.module_type, f.severity) == ("attn", "Attention", "error")
    assert f.op == "torch.nn.functional.scaled_dot_product_attention"
    assert {t.dtype for t in f.tensors} == {"float16", "float32"}


def test_index_put_mixed_dtypes():
    class Scatter(nn.Module):
        def forward(self, x, v):
            y = x.clone()
            y[torch.tensor([0, 2])] = v
            return y

    x, v = torch.zeros(3, 4), torch.ones(2, 4, dtype=F16)
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match"):
        Scatter()(x, v)
    f = only_dd101(dtype_doctor.diagnose(Scatter(), {"x": x, "v": v}))
    assert f.op.startswith("aten.index_put")
    assert [t.dtype for t in f.tensors] == ["float32", "float16"]
    # Same dtypes: accepted, nothing to say.
    Scatter()(x, v.float())
    assert dtype_doctor.diagnose(Scatter(), {"x": x, "v": v.float()}).findings == ()


# ------------------------------------------------------- many mismatches, one pass


class Branches(nn.Module):
    """Four independent mistakes on one fp32 input; PyTorch reports only the first."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleDict(
            {
                "text": nn.Sequential(nn.Linear(8, 8).half()),
                "audio": nn.Sequential(nn.Identity(), nn.Conv1d(2, 2, 3, padding=1).to(BF16)),
                "norm": nn.LayerNorm(8).half(),
            }
        )
        self.fine = nn.Linear(8, 8)  # fp32 like the input: no finding
        self.head = nn.Linear(8, 2).to(F64)

    def forward(self, x):
        a = self.encoder["text"](x).float()
        b = self.encoder["audio"](x.view(2, 2, 8)).float().reshape(4, 8)
        c = self.encoder["norm"](x).float()
        h = self.fine(x) + a + b + c
        return self.head(h)


BRANCH_MODULES = {
    ("DD101", "encoder.text.0"),
    ("DD101", "encoder.audio.1"),
    ("DD101", "encoder.norm"),
    ("DD101", "head"),
}


def test_every_mismatch_in_one_pass():
    model = Branches().eval()
    x = torch.randn(4, 8)
    # PyTorch stops at the first one.
    with pytest.raises(RuntimeError, match="must have the same dtype, but got Float and Half"):
        model(x)
    report = dtype_doctor.diagnose(model, {"x": x})
    assert located(report, {"DD101"}) == BRANCH_MODULES
    assert report.trace.failure is None
    # Each one is real on its own: the module alone, given the dtype it was given, raises.
    modules = dict(model.named_modules())
    for f in found(report, "DD101"):
        given = next(t for t in f.tensors if t.role == "input")
        shape = (2, 2, 8) if "audio" in f.module else (4, 8)
        with pytest.raises(RuntimeError):
            modules[f.module](torch.randn(*shape, dtype=getattr(torch, given.dtype)))


def test_dotted_module_names_and_op_names():
    report = dtype_doctor.diagnose(Branches().eval(), {"x": torch.randn(4, 8)})
    ops = {f.module: (f.module_type, f.op) for f in found(report, "DD101")}
    assert ops["encoder.text.0"] == ("Linear", "aten.addmm.default")
    assert ops["encoder.audio.1"][0] == "Conv1d" and ops["encoder.audio.1"][1] in (
        "aten.convolution.default",
        "torch.conv1d",
    )
    assert ops["encoder.norm"] == ("LayerNorm", "aten.native_layer_norm.default")
    assert ops["head"] == ("Linear", "aten.addmm.default")
    assert "fine" not in ops


def test_odd_weight_comes_from_model_loading():
    """An fp32 model with one fp16 layer: the weight is the odd one out, not the batch."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
            self.adapter = nn.Linear(16, 4).half()

        def forward(self, x):
            return self.adapter(self.body(x))

    x = torch.randn(2, 16)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        Model()(x)
    f = only_dd101(dtype_doctor.diagnose(Model(), {"x": x}))
    assert (f.module, f.stage) == ("adapter", "model-loading")
    assert "float16 weight" in f.message and "adapter.weight" in f.message
    assert {fx.strategy for fx in f.fixes} <= {"half-model", "autocast", "cast-inputs"}


# ------------------------------------------------------------------------- autocast


def test_autocast_resolves_fp32_weight_bf16_activation():
    model = One(nn.Linear(8, 4))
    x = torch.randn(2, 8, dtype=BF16)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        model(x)
    with torch.autocast("cpu", dtype=BF16):
        assert model(x).dtype == BF16  # autocast casts per op: PyTorch accepts it

    assert len(found(dtype_doctor.diagnose(model, {"x": x}), "DD101")) == 1
    under = dtype_doctor.diagnose(model, {"x": x}, autocast="bfloat16")
    assert under.findings == ()
    assert under.trace.autocast == "bfloat16"
    assert any(op.autocast == "bfloat16" for op in under.trace.ops)


def test_fp32_weights_under_autocast_are_fine():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=BF16):
        model(x)
    assert dtype_doctor.diagnose(model, {"input": x}, autocast="bfloat16").findings == ()


@pytest.mark.parametrize("ac", [BF16, F16])
def test_float64_input_is_not_cast_by_autocast(ac):
    """Autocast casts every floating operand of a conv but float64 ones: the conv still fails."""
    model = One(nn.Conv1d(4, 4, 3))
    x = torch.randn(2, 4, 8, dtype=F64)
    with torch.autocast("cpu", dtype=ac), raises_dtype_error("float64"):
        model(x)
    name = str(ac).removeprefix("torch.")
    for simulate in (False, True):
        f = only_dd101(dtype_doctor.diagnose(model, {"x": x}, autocast=name, simulate=simulate, device="cpu"))
        assert (f.module, f.op, f.severity) == ("block.layer", "torch.conv1d", "error")
        assert "float64" in f.message


def test_half_input_is_cast_by_autocast():
    model = One(nn.Conv1d(4, 4, 3))
    x = torch.randn(2, 4, 8, dtype=F16)
    with torch.autocast("cpu", dtype=BF16):
        assert model(x).dtype == BF16
    assert dtype_doctor.diagnose(model, {"x": x}, autocast="bfloat16").findings == ()


# ----------------------------------------------------------- simulate == real trace


def _branches():
    return Branches().eval(), {"x": torch.randn(4, 8)}


def _linear():
    return One(nn.Linear(8, 4).half()), {"x": torch.randn(3, 8)}


def _norm():
    return One(nn.GroupNorm(2, 4).half()), {"x": torch.randn(2, 4, 8)}


def _wav2vec2_float64():
    return load_fixture("wav2vec2-tiny"), {"input_values": torch.randn(2, 4000, dtype=F64)}


@pytest.mark.parametrize(
    "build", [_branches, _linear, _norm, pytest.param(_wav2vec2_float64)]
)
def test_simulate_finds_what_the_real_trace_finds(build):
    model, inputs = build()
    real = dtype_doctor.diagnose(model, inputs)
    fake = dtype_doctor.diagnose(model, inputs, simulate=True, device="cpu")
    assert real.findings, "the case must have something to find"
    assert located(fake) == located(real)
    assert fake.trace.simulated and not real.trace.simulated


@pytest.fixture(scope="module")
def resnet_fp16():
    return load_fixture("resnet-tiny", dtype=F16)


def test_half_resnet_fed_fp32_pixels(resnet_fp16):
    px = torch.randn(2, 3, 32, 32)
    with raises_dtype_error("float32", "float16"):
        resnet_fp16(pixel_values=px)
    report = dtype_doctor.diagnose(resnet_fp16, {"pixel_values": px})
    f = only_dd101(report)
    assert f.module == "resnet.embedder.embedder.convolution"
    assert f.module_type == "Conv2d" and f.stage == "collator"
    assert {t.name for t in f.tensors} >= {"pixel_values", "resnet.embedder.embedder.convolution.weight"}
    assert names_dtypes(f.pytorch_error, "float32", "float16")
    # The repaired trace runs on through the whole network in fp16.
    assert report.trace.failure is None
    assert any(m.name == "classifier.1" for m in report.trace.modules)
    # Cast the batch and nothing is left.
    resnet_fp16(pixel_values=px.half())
    assert found(dtype_doctor.diagnose(resnet_fp16, {"pixel_values": px.half()}), "DD101") == []


def test_simulate_half_resnet_reports_only_the_real_mismatch(resnet_fp16):
    px = torch.randn(2, 3, 32, 32)
    real = dtype_doctor.diagnose(resnet_fp16, {"pixel_values": px})
    fake = dtype_doctor.diagnose(resnet_fp16, {"pixel_values": px}, simulate=True, device="cpu")
    assert located(fake, {"DD101"}) == located(real, {"DD101"})


@pytest.mark.slow
def test_minilm_half_with_an_fp32_pooler():
    from helpers_models import load_minilm

    model, enc = load_minilm(dtype=F16)
    assert model(**enc).last_hidden_state.dtype == F16  # int64 ids, fp16 weights: fine
    assert dtype_doctor.diagnose(model, enc).findings == ()
    model.pooler.dense.float()
    with pytest.raises(RuntimeError, match="must have the same dtype, but got Half and Float"):
        model(**enc)
    real = dtype_doctor.diagnose(model, enc)
    assert [(f.module, f.severity) for f in found(real, "DD101")] == [("pooler.dense", "error")]
    fake = dtype_doctor.diagnose(model, enc, simulate=True, device="cuda")
    assert located(fake) == located(real) and fake.target.device == "cuda:0"


def test_a_training_trace_goes_on_through_the_backward_of_a_repaired_op() -> None:
    """The forward repair is below autograd, so convolution_backward sees the original mixed
    operands; oneDNN fails there without naming dtypes. The trace must still finish."""
    model, x = nn.Conv2d(3, 4, 3, bias=False).half(), torch.randn(2, 3, 8, 8)  # ResNet's convs have no bias
    with pytest.raises(RuntimeError):
        model(x)
    report = dtype_doctor.diagnose(model, {"input": x}, train=True)
    assert report.trace.failure is None
    assert [f.code for f in report.findings if f.severity == "error"] == ["DD101"]
    assert any(op.phase == "backward" and op.recovered for op in report.trace.ops)
