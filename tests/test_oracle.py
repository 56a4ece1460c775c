"""PyTorch is the oracle: every error a real forward raises is an error-level finding.

Two halves: the examples the oracle issue named, each shown failing in plain PyTorch first;
then a reproducible sample of PyTorch's own op and module databases (valid samples with one
argument cast to another dtype, the ops' dtype error inputs, clean samples, float32 modules
given one input in another dtype), where the normal-mode verdict must equal the real call's
outcome in both directions. The full sweep is
benchmarks/oracle_sweep.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtype_doctor
import opdb_cases as oc
from helpers_models import Call
from helpers_errors import names_dtypes, raises_dtype_error


def _errors(report) -> list[str]:  # noqa: ANN001
    return [f.code for f in report.findings if f.severity == "error"]


# Each: the call, its inputs, and the code that must explain the refusal.
NAMED = {
    "put with a source of another dtype": (
        lambda x, i, s: torch.put(x, i, s), dict(x=torch.zeros(4).half(), i=torch.tensor([0, 1]), s=torch.ones(2)), "DD100"),
    "scatter_add with a source of another dtype": (
        lambda x, i, s: x.scatter_add(0, i, s), dict(x=torch.zeros(4).half(), i=torch.tensor([0, 1]), s=torch.ones(2)), "DD100"),
    "index_add with a source of another dtype": (
        lambda x, i, s: x.index_add(0, i, s), dict(x=torch.zeros(4), i=torch.tensor([0, 1]), s=torch.ones(2).double()), "DD100"),
    "index_copy with a source of another dtype": (
        lambda x, i, s: x.index_copy(0, i, s), dict(x=torch.zeros(4), i=torch.tensor([0, 1]), s=torch.ones(2).half()), "DD100"),
    "masked_scatter with a source of another dtype": (
        lambda x, m, s: x.masked_scatter(m, s), dict(x=torch.zeros(4), m=torch.tensor([True, False, True, False]), s=torch.ones(4).double()), "DD100"),
    "lerp with an end of another dtype": (
        lambda a, b: torch.lerp(a, b, 0.5), dict(a=torch.zeros(4).bfloat16(), b=torch.ones(4)), "DD100"),
    "grid_sample with an fp32 grid and fp16 input": (
        lambda x, g: F.grid_sample(x, g, align_corners=False), dict(x=torch.rand(1, 1, 4, 4).half(), g=torch.rand(1, 2, 2, 2)), "DD100"),
    "nll_loss with an fp32 class weight and fp16 input": (
        lambda x, t, w: F.nll_loss(x, t, weight=w), dict(x=torch.rand(3, 4).half(), t=torch.tensor([0, 1, 2]), w=torch.ones(4)), "DD100"),
    "out= of the wrong dtype": (
        lambda x, i, out: torch.gather(x, 0, i, out=out), dict(x=torch.rand(3), i=torch.tensor([0, 1]), out=torch.empty(2, dtype=torch.float64)), "DD100"),
    "binary_cross_entropy with a float64 target": (
        lambda p, t: F.binary_cross_entropy(p, t), dict(p=torch.rand(4), t=torch.rand(4).double()), "DD104"),
    "gelu on integers": (lambda x: F.gelu(x), dict(x=torch.arange(4)), "DD107"),
    "neg on bool": (lambda x: -x, dict(x=torch.tensor([True, False])), "DD107"),
    "mean of integers": (lambda x: x.mean(), dict(x=torch.arange(4)), "DD107"),
}


@pytest.mark.parametrize("name", NAMED)
def test_a_refusal_pytorch_raises_is_an_error_finding(name: str) -> None:
    fn, inputs, code = NAMED[name]
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        fn(**{k: v.clone() for k, v in inputs.items()})  # what PyTorch does
    report = dtype_doctor.diagnose(Call(fn), inputs)
    assert code in _errors(report), report.findings
    found = next(f for f in report.findings if f.code == code)
    assert found.pytorch_error, "PyTorch's message travels with the finding"
    assert "DD001" not in _errors(report)


@pytest.mark.parametrize("simulate", [False, True])
@pytest.mark.parametrize("cls", [nn.RNN, nn.GRU, nn.LSTM])
def test_an_rnn_refusing_its_input_dtype_does_not_end_the_trace(cls: type, simulate: bool) -> None:
    """nn.RNNBase checks the input dtype in Python before any kernel: the refusal is a DD101
    with both operands and a fix, and the trace goes on to the error after it."""

    class RnnThenScatter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = cls(4, 3)

        def forward(self, x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            h = self.rnn(x)[0]
            return h.new_zeros(4).half().scatter_add(0, i, v)  # a second refusal: src float32

    model, x = RnnThenScatter(), torch.rand(2, 1, 4).half()
    inputs = {"x": x, "i": torch.tensor([0, 1]), "v": torch.ones(2)}
    with raises_dtype_error("float16", "float32", error=ValueError):
        model.rnn(x)
    report = dtype_doctor.diagnose(model, inputs, **({"simulate": True, "device": "cuda"} if simulate else {}))
    rnn = next(f for f in report.findings if f.module == "rnn")
    assert (rnn.code, rnn.severity, rnn.op) == ("DD101", "error", "torch.nn.RNNBase.check_input")
    assert [(t.role, t.dtype) for t in rnn.tensors] == [("input", "float16"), ("weight", "float32")]
    assert rnn.fixes and rnn.remedies and names_dtypes(rnn.pytorch_error, "float16", "float32")
    assert "DD100" in _errors(report), "the scatter_add after the RNN is still traced"
    assert report.trace.failure is None


def test_watch_lets_the_rnn_refusal_propagate_and_names_it() -> None:
    rnn, x = nn.GRU(4, 3), torch.rand(2, 1, 4).half()
    with pytest.raises(ValueError), dtype_doctor.watch(rnn) as w:
        rnn(x)
    assert _errors(w.report) == ["DD101"], w.report.findings


def test_an_lstm_given_a_half_hidden_state() -> None:
    rnn = nn.LSTM(4, 3, batch_first=True)
    x, h = torch.rand(2, 5, 4), (torch.zeros(1, 2, 3).half(), torch.zeros(1, 2, 3).half())
    with pytest.raises(RuntimeError):
        rnn(x, h)
    report = dtype_doctor.diagnose(Call(lambda x, h, c: rnn(x, (h, c))), {"x": x, "h": h[0], "c": h[1]})
    assert "DD100" in _errors(report)


def test_one_refusal_is_one_finding_at_the_op_that_refused() -> None:
    """F.cross_entropy around nll_loss_forward: the error passes through both records."""
    logits, labels = torch.rand(3, 4), torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError):
        F.cross_entropy(logits, labels)
    report = dtype_doctor.diagnose(Call(lambda x, y: F.cross_entropy(x, y)), {"x": logits, "y": labels})
    assert _errors(report) == ["DD104"]


def test_a_pattern_the_kernel_accepts_is_not_an_error() -> None:
    """addr promotes mixed dtypes; a rule's pattern must not overrule the kernel."""
    a, b, c = torch.rand(3, 3), torch.rand(3).half(), torch.rand(3)
    torch.addr(a, b, c)  # accepted
    report = dtype_doctor.diagnose(Call(lambda a, b, c: torch.addr(a, b, c)), {"a": a, "b": b, "c": c})
    assert _errors(report) == []


# ------------------------------------------------------------------ op_db sample

CASES = oc.sampled(90, per_op=2, seed=9) + oc.sampled_modules(30, per_module=2, seed=9)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_normal_mode_agrees_with_the_real_call(case: oc.Case) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = oc.real_error(case)
        report = oc.doctor_report(case)
    errors = oc.errors_in(report)
    if real is None:
        assert not errors, f"false alarm: {[f.message for f in errors]}"
        if case.kind in oc.CLEAN:
            assert not oc.warnings_in(report), f"warning on a clean sample: {[f.message for f in oc.warnings_in(report)]}"
    else:
        assert errors, f"dropped: {type(real).__name__}: {real}"
        if oc.about_dtypes(real):
            assert [f.code for f in errors] != ["DD001"], "a dtype refusal reported as a failed trace"


# ------------------------------------------------------------------ simulated verdicts


@pytest.mark.parametrize("case", CASES, ids=str)
def test_simulated_verdict_agrees_with_the_real_kernel(case: oc.Case) -> None:
    """simulate=True on a CUDA target: the real CPU outcome, turned into CUDA's by PyTorch's own
    declarations (oc.expected_on_cuda reads op_db and kernel sources, not the table under test).
    A real error the simulation only reports as "fake tensors cannot follow" is a disagreement."""
    real = oc.real_error(case)
    limit = oc.simulation_limit(case, real)
    if limit:
        pytest.skip(limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = oc.expected_on_cuda(case, real)
        report = oc.doctor_report(case, simulate=True, device="cuda")
    errors = oc.errors_in(report)
    assert bool(errors) == (expected is not None), f"expected on CUDA: {expected}; doctor: {[f.message for f in report.findings]}"
    if case.kind in oc.CLEAN and expected is None:
        # The one warning a clean sample may get: a step fake tensors cannot take (the trace is partial).
        other = [f for f in oc.warnings_in(report) if not oc.cannot_follow(f)]
        assert not other, f"warning on a clean sample: {[f.message for f in other]}"


# Rows of the shipped op_dtypes.json, each checked by hand against PyTorch's sources (not read
# from the generator): scripts/gen_op_dtypes.py must reproduce them on any build.
TABLE_FACTS = [
    # op, dtype, CPU runs it, CUDA runs it, capability CUDA needs for it, where PyTorch says so
    ("mm", "int64", True, False, None, 'aten/src/ATen/native/cuda/Blas.cpp: "addmm_cuda" dispatches floating and complex types only'),
    ("linear", "bfloat16", True, True, None, "op_db: linear's dtypesIfCUDA lists bfloat16 unconditionally"),
    ("matmul", "bfloat16", True, True, "5.3", "op_db: matmul's dtypesIfCUDA adds bfloat16 if SM53OrLater"),
    ("_flash_attention_forward", "bfloat16", False, True, "8.0", "op_db: bfloat16 if SM80OrLater (flash attention has no sm_7x bf16 kernel)"),
    ("max_pool2d", "int32", True, False, None, "max_pool2d_with_indices_out_cuda dispatches floating types, Half and BFloat16 only"),
    ("histogram", "float32", True, False, None, "torch.histogram has CPU kernels only"),
]


@pytest.mark.parametrize("op, dtype, cpu, cuda, needs, where", TABLE_FACTS, ids=[f"{r[0]}-{r[1]}" for r in TABLE_FACTS])
def test_shipped_table_rows_match_pytorch(op: str, dtype: str, cpu: bool, cuda: bool, needs: str | None, where: str) -> None:
    import json
    from importlib import resources

    row = json.loads(resources.files("dtype_doctor.data").joinpath("op_dtypes.json").read_text())["ops"][op]
    assert (dtype in row["cpu"], dtype in row["cuda"], row.get("cuda_needs", {}).get(dtype)) == (cpu, cuda, needs), where


def test_a_simulated_trace_asks_each_signature_once() -> None:
    """The probe is cached by signature: six identical layers cost one addmm probe."""
    import dtype_doctor.trace.probe as probe_module

    seen: list[str] = []

    class Counting(probe_module.KernelProbe):
        def _run(self, func, args, kwargs):  # noqa: ANN001, ANN202
            seen.append(str(func))
            return super()._run(func, args, kwargs)

    probe_module.KernelProbe, saved = Counting, probe_module.KernelProbe
    try:
        model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
        dtype_doctor.diagnose(model, {"input": torch.rand(2, 8)}, simulate=True, device="cuda")
    finally:
        probe_module.KernelProbe = saved
    assert seen.count("aten.addmm.default") == 1


def test_integer_gelu_is_refused_in_simulation_as_on_the_cpu() -> None:
    x = torch.arange(6)
    with pytest.raises(NotImplementedError):
        F.gelu(x)
    report = dtype_doctor.diagnose(Call(lambda x: F.gelu(x)), {"x": x}, simulate=True, device="cuda")
    assert _errors(report) == ["DD107"]


def test_integer_matmul_runs_on_cpu_but_has_no_cuda_kernel() -> None:
    """A CPU↔CUDA table row: op_db lists integer mm for CPU only."""
    a, b = torch.arange(4).view(2, 2), torch.arange(4).view(2, 2)
    torch.mm(a, b)  # this CPU runs it
    call = Call(lambda a, b: torch.mm(a, b))
    assert _errors(dtype_doctor.diagnose(call, {"a": a, "b": b})) == []
    assert _errors(dtype_doctor.diagnose(call, {"a": a, "b": b}, simulate=True, device="cuda")) == ["DD107"]


@pytest.mark.parametrize("gpu, slow", [("t4", True), ("v100", True), ("7.5", True), ("a100", False), ("h100", False), ("8.0", False)])
def test_bf16_matmul_runs_before_compute_capability_8_without_tensor_cores(gpu: str, slow: bool) -> None:
    """op_db lists bf16 mm/addmm/linear for CUDA on every GPU (matmul/bmm from sm_53), and bf16
    matmul runs on a V100 (pytorch/pytorch#124996): before 8.0 it is slow, not refused."""
    model, x = nn.Linear(4, 2).to(torch.bfloat16), torch.rand(3, 4).to(torch.bfloat16)
    report = dtype_doctor.diagnose(model, {"input": x}, simulate=True, device="cuda", gpu=gpu)
    assert _errors(report) == []
    assert [(f.code, f.severity) for f in report.findings if f.code == "DD107"] == ([("DD107", "warning")] if slow else [])
    assert report.to_dict()["target"]["gpu"].startswith(gpu if not gpu[0].isdigit() else "sm_")


@pytest.mark.parametrize("gpu, refused", [("v100", True), ("t4", True), ("a100", False)])
def test_bf16_flash_attention_kernel_needs_compute_capability_8(gpu: str, refused: bool) -> None:
    """The one bf16 refusal op_db gates on SM80OrLater: the flash/efficient attention kernels."""
    q = torch.rand(1, 2, 4, 8).to(torch.bfloat16)
    call = Call(lambda q: torch.ops.aten._efficient_attention_forward(q, q, q, None, None, None, None, None, 0.0, 0, False))
    report = dtype_doctor.diagnose(call, {"q": q}, simulate=True, device="cuda", gpu=gpu)
    assert ("DD107" in _errors(report)) is refused, report.findings


def test_simulated_cuda_autocast_runs_layer_norm_in_fp32() -> None:
    """A bf16 checkpoint under fp16 autocast: CPU autocast leaves layer_norm to fp16 input and
    bf16 weights (refused on this CPU); CUDA autocast runs layer_norm in fp32."""
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to(torch.bfloat16)
    x = torch.rand(2, 4)
    with pytest.raises(RuntimeError), torch.autocast("cpu", dtype=torch.float16):
        model(x)
    assert "DD101" in _errors(dtype_doctor.diagnose(model, {"input": x}, autocast="float16"))
    report = dtype_doctor.diagnose(model, {"input": x}, autocast="float16", simulate=True, device="cuda")
    assert _errors(report) == []
    norm = next(op for op in report.trace.ops if "layer_norm" in op.op)
    assert {t.dtype for t in norm.operands} == {"float32"} and norm.autocast == "float16"


class SelfAttention(nn.Module):
    def __init__(self, layer: str) -> None:
        super().__init__()
        self.layer = nn.MultiheadAttention(8, 2) if layer == "mha" else nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, x, x, need_weights=False)[0] if isinstance(self.layer, nn.MultiheadAttention) else self.layer(x)


def _matmuls(trace) -> list[tuple[str, list[str]]]:  # noqa: ANN001
    return [(o.op.split(".")[1], [t.dtype for t in o.operands if not t.is_scalar]) for o in trace.ops
            if o.op.split(".")[1] in ("addmm", "mm", "bmm", "baddbmm") and o.phase == "forward"]


@pytest.mark.parametrize("layer", ["mha", "encoder"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_simulated_cuda_autocast_casts_inside_python_functions(layer: str, dtype: str) -> None:
    """nn.MultiheadAttention runs F.multi_head_attention_forward, a Python function whose linear
    and bmm calls autocast casts (CPU's and CUDA's lists agree on them): fp32 weights and an fp16
    input run under autocast, for real on this CPU and in a simulated CUDA trace."""
    model, x = SelfAttention(layer).eval(), torch.rand(3, 2, 8).half()
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        model(x)  # real CPU autocast runs it
    real = dtype_doctor.diagnose(model, {"x": x}, autocast=dtype)
    sim = dtype_doctor.diagnose(model, {"x": x}, autocast=dtype, simulate=True, device="cuda")
    assert _errors(real) == [] and _errors(sim) == [], sim.findings
    linear = [ops for name, ops in _matmuls(sim.trace) if name == "addmm"]
    assert linear and all(set(ops) == {dtype} for ops in linear), _matmuls(sim.trace)


class Disabled(nn.Module):
    """A block the model keeps out of autocast, as rotary embeddings do."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.proj = device_type, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(self.device_type, enabled=False):
            scores = x.float() @ x.float().T
        return self.proj(x), scores


def test_simulated_cuda_autocast_honours_a_disabled_block() -> None:
    x = torch.rand(2, 4)
    real = dtype_doctor.diagnose(Disabled("cpu"), {"x": x}, autocast="float16")
    sim = dtype_doctor.diagnose(Disabled("cuda"), {"x": x}, autocast="float16", simulate=True, device="cuda")
    assert _matmuls(sim.trace) == _matmuls(real.trace) == [("mm", ["float32", "float32"]), ("addmm", ["float16", "float16", "float16"])]
    mm = next(o for o in sim.trace.ops if o.op.startswith("aten.mm"))
    assert mm.autocast is None


def test_cuda_autocast_refuses_binary_cross_entropy() -> None:
    """A CPU↔CUDA table row: CPU autocast runs binary_cross_entropy in float32, CUDA's registers
    binary_cross_entropy_banned (aten/src/ATen/autocast_mode.cpp)."""
    call = Call(lambda x, y: F.binary_cross_entropy(call.head(x), y))
    call.head = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    x, y = torch.rand(2, 4), torch.rand(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        call(x=x, y=y)  # CPU autocast runs it
    assert _errors(dtype_doctor.diagnose(call, {"x": x, "y": y}, autocast="bfloat16")) == []
    report = dtype_doctor.diagnose(call, {"x": x, "y": y}, autocast="float16", simulate=True, device="cuda")
    assert _errors(report) == ["DD100"]
    bce = report.findings[0]
    assert "unsafe to autocast" in bce.pytorch_error and "with_logits" in bce.fixes[0].description
    assert report.trace.failure is None, "the trace goes on past the refusal"


def test_simulated_cuda_autocast_runs_an_rnn_in_half_as_cudnn_does() -> None:
    """cuDNN's RNN autocast wrapper casts input, weights and states to float16, and nn.RNNBase
    skips its input-dtype check under autocast: no refusal."""
    rnn, x = nn.GRU(4, 3), torch.rand(2, 1, 4).half()
    report = dtype_doctor.diagnose(rnn, {"input": x}, autocast="bfloat16", simulate=True, device="cuda")
    assert _errors(report) == []


def test_a_model_without_parameters_reports_the_simulated_device() -> None:
    report = dtype_doctor.diagnose(Call(lambda x: x * 2), {"x": torch.rand(2)}, simulate=True, device="cuda")
    assert report.target.device == "cuda:0" and report.target.simulated


def test_a_meta_input_is_a_device_mismatch_not_a_silent_move() -> None:
    model, x = nn.Linear(3, 2), torch.rand(2, 3, device="meta")
    with pytest.raises(RuntimeError):
        model(x)
    report = dtype_doctor.diagnose(model, {"input": x})
    assert _errors(report) == ["DD201"]


def test_max_pool1d_refusal_on_its_mode_free_cpu_path_is_not_dropped() -> None:
    """PyTorch's CPU max_pool1d takes a float-only kernel unless a tensor subclass or mode is
    active; under the recorder it would take the integer-capable path and miss the error."""
    x = torch.arange(8).view(1, 1, 8).int()
    with pytest.raises(NotImplementedError):
        F.max_pool1d(x, 2)
    report = dtype_doctor.diagnose(Call(lambda x: F.max_pool1d(x, 2)), {"x": x})
    assert _errors(report) == ["DD107"]
