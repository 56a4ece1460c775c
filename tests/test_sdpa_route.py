"""A simulated CUDA step runs scaled_dot_product_attention on the kernel the GPU picks
(trace/sdpa_route.py), not on the math fallback a CPU-only build takes for the stand-ins.

The oracle for what comes out is real PyTorch on this CPU: the output's and the gradients' dtypes
and shapes are those of the plain call. The kernel is the one ops/sdpa.py names for the GPU
(torch's select_sdp_backend); on a GPU, the CUDA-marked test reads it from the profiler.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dtype_doctor
from dtype_doctor.ops.sdpa import SdpaCall, cuda_backend
from dtype_doctor.records import TensorMeta

FUSED = {"flash": "aten._scaled_dot_product_flash_attention", "efficient": "aten._scaled_dot_product_efficient_attention"}


class Attention(torch.nn.Module):
    def __init__(self, causal: bool, gqa: bool) -> None:
        super().__init__()
        self.causal, self.gqa = causal, gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=self.gqa)
        return out.float().square().sum()


def _inputs(dtype: torch.dtype, head: int, heads_kv: int, mask: str | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 6, head, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, heads_kv, 6, head, dtype=dtype, requires_grad=True) for _ in range(2))
    out = {"q": q, "k": k, "v": v}
    if mask == "bool":
        out["mask"] = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    elif mask == "float":
        out["mask"] = torch.zeros(2, 1, 6, 6, dtype=dtype)
    return out


def _expected(gpu: str, inputs: dict[str, torch.Tensor], causal: bool, gqa: bool) -> str:
    meta = {n: TensorMeta(str(t.dtype).removeprefix("torch."), "cuda", tuple(t.shape)) for n, t in inputs.items()}
    call = SdpaCall(meta["q"], meta["k"], meta["v"], meta.get("mask"), 0.0, causal, gqa, True)
    return cuda_backend(call, dtype_doctor.machine.gpus.gpu_profile(gpu).capability).backend


CASES = [  # gpu, dtype, head dim, key/value heads, mask, is_causal
    ("a100", torch.bfloat16, 8, 4, None, True),  # flash
    ("a100", torch.bfloat16, 12, 2, None, False),  # flash, grouped-query heads, a head dim padded to 16
    ("a100", torch.float32, 8, 4, "bool", False),  # memory-efficient: float32, a bool mask made additive
    ("t4", torch.float16, 8, 4, "float", False),  # memory-efficient on a T4
    ("t4", torch.bfloat16, 8, 4, None, True),  # math: no fused bf16 kernel before sm80
    ("a100", torch.float32, 6, 4, None, False),  # math: a float32 head dim that is no multiple of 4
]


@pytest.mark.parametrize(("gpu", "dtype", "head", "heads_kv", "mask", "causal"), CASES)
def test_the_simulated_step_runs_the_gpus_kernel(gpu: str, dtype: torch.dtype, head: int, heads_kv: int, mask: str | None,
                                                 causal: bool) -> None:
    gqa = heads_kv != 4
    model = Attention(causal, gqa)
    inputs = _inputs(dtype, head, heads_kv, mask)
    plain = F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=inputs.get("mask"),
                                           is_causal=causal, enable_gqa=gqa)
    model(**inputs).backward()  # the plain step on this CPU: the oracle for dtypes and shapes
    grads = {n: (t.grad.dtype, t.grad.shape) for n, t in inputs.items() if t.grad is not None}

    report = dtype_doctor.diagnose(model, inputs, simulate=True, device="cuda", gpu=gpu, train=True)
    backend = _expected(gpu, inputs, causal, gqa)
    ops = [op.op for op in report.trace.ops]
    [sdpa] = [op for op in report.trace.ops if op.op == "torch.nn.functional.scaled_dot_product_attention"]
    assert (sdpa.outputs[0].dtype, sdpa.outputs[0].shape) == (str(plain.dtype).removeprefix("torch."), tuple(plain.shape))
    if backend in FUSED:
        assert any(o.startswith(FUSED[backend]) and not o.endswith("backward") for o in ops), ops
        assert any(o.startswith(FUSED[backend] + "_backward") for o in ops), ops
        assert not any(o.startswith("aten._safe_softmax") for o in ops)
    else:
        assert not any(o.startswith(tuple(FUSED.values())) for o in ops) and any(o.startswith("aten._safe_softmax") for o in ops)
    assert [f.code for f in report.findings if f.severity == "error"] == []
    assert grads == {n: (t.grad.dtype, t.grad.shape) for n, t in inputs.items() if t.grad is not None}


def test_without_a_gpu_named_the_stand_ins_run_as_the_machine_answers() -> None:
    """No --gpu: the simulated machine answers torch.cuda.get_device_capability() as an A100, and
    SDPA runs the A100's kernel; the report still names no backend (it depends on the GPU)."""
    inputs = _inputs(torch.bfloat16, 8, 4, None)
    report = dtype_doctor.diagnose(Attention(True, False), inputs, simulate=True, device="cuda")
    assert any(op.op.startswith(FUSED["flash"]) for op in report.trace.ops)
    assert report.to_dict()["target"]["attention"]["sdpa_backend"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("dtype", "mask"), [(torch.bfloat16, None), (torch.float32, "bool"), (torch.float16, "float")])
def test_the_kernel_is_the_one_the_gpu_runs(dtype: torch.dtype, mask: str | None) -> None:
    """On a GPU: the profiler names the kernel the simulated step ran for the same call."""
    from torch.profiler import ProfilerActivity, profile

    inputs = {n: t.detach().cuda() for n, t in _inputs(dtype, 8, 4, mask).items()}
    major, minor = torch.cuda.get_device_capability()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=inputs.get("mask"), is_causal=mask is None)
    ran = {e.name.replace("::", ".") for e in prof.events()}  # the profiler names aten::op
    if "aten._scaled_dot_product_cudnn_attention" in ran:
        pytest.skip("this GPU's cuDNN took the call: the cuDNN backend is not modelled (docs/simulation.md)")
    meta = {n: TensorMeta(str(t.dtype).removeprefix("torch."), "cuda", tuple(t.shape)) for n, t in inputs.items()}
    backend = cuda_backend(SdpaCall(meta["q"], meta["k"], meta["v"], meta.get("mask"), 0.0, mask is None), (major, minor)).backend
    if backend in FUSED:
        assert FUSED[backend] in ran, ran
    else:
        assert not ran & set(FUSED.values()), ran


@pytest.mark.parametrize(("allowed", "ran"), [("MATH", None), ("EFFICIENT_ATTENTION", "efficient")])
def test_a_backend_the_script_turned_off_is_not_run(allowed: str, ran: str | None) -> None:
    """`with sdpa_kernel(...)` turns backends off for the block (torch.backends.cuda's flags), here as
    on the GPU: the bf16 causal call that takes flash on an A100 takes what the block allows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, allowed)):
        report = dtype_doctor.diagnose(Attention(True, False), _inputs(torch.bfloat16, 8, 4, None), simulate=True,
                                       device="cuda", gpu="a100")
    fused = {b for b, name in FUSED.items() if any(op.op.startswith(name) for op in report.trace.ops)}
    assert fused == ({ran} if ran else set())


def test_memory_efficient_grouped_query_heads_keep_the_math_fallback() -> None:
    """A masked grouped-query call (memory-efficient on an A100) trains: PyTorch's meta backward of that
    kernel has no grouped-query shapes, so the stand-ins take the composite's math path."""
    inputs = _inputs(torch.bfloat16, 8, 2, "float")
    report = dtype_doctor.diagnose(Attention(False, True), inputs, simulate=True, device="cuda", gpu="a100", train=True)
    assert _expected("a100", inputs, False, True) == "efficient"
    assert report.trace.failure is None and [f.code for f in report.findings if f.severity == "error"] == []
    assert not any(op.op.startswith(tuple(FUSED.values())) for op in report.trace.ops)
    with torch.no_grad():  # no backward to run: the kernel the GPU picks
        report = dtype_doctor.diagnose(Attention(False, True), inputs, simulate=True, device="cuda", gpu="a100")
    assert any(op.op.startswith(FUSED["efficient"]) for op in report.trace.ops)


LEFT_ON_THE_CPU = """\
import torch
import torch.nn.functional as F

class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 6, 3, 1, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)

encoder, unet = Encoder(), torch.nn.Linear(8, 8).to("cuda")  # the script forgot encoder.to("cuda")
context = encoder(torch.randn(2, 6, 8))
loss = unet(context.to("cuda")).float().pow(2).mean()
loss.backward()
print("trained", context.device, loss.device)
"""


def test_attention_the_script_left_on_the_cpu_runs_the_cpus_kernel(tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    """diffusers' DreamBooth with its text encoder left on the CPU (the script sweep's injected `model-to`):
    the encoder's SDPA gets real CPU tensors and runs as the CPU runs it (here: to the end), not as a CUDA
    kernel, which has no CPU implementation."""
    from helpers_cli import run_json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEFT_ON_THE_CPU)
    code, report, err = run_json(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", "train.py"], capsys)
    assert report is not None, err
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == [], report["findings"]
    [row] = report["target"]["attention"]["sdpa"]  # the encoder's call was traced, on the CPU
    assert row["calls"] == 1 and "scaled_dot_product" not in err, (row, err)
