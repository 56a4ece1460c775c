"""The simulated machine behaves like the GPU: the model keeps its identity through `.to("cuda")`,
`torch.cuda` answers as the `--gpu` profile, users read CUDA's wording (never "meta"), and a
library op without a fake implementation is a named limit of the simulation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict | None, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, (json.loads(captured.out) if captured.out.strip().startswith("{") else None), captured.err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


TIED = """\
import torch


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)
        self.block = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 32, bias=False)
        self.head.weight = self.emb.weight  # weight tying


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # made before the move, as many scripts do
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
print("params", sum(p.numel() for p in model.parameters()), "tied", model.head.weight is model.emb.weight,
      "optimizer sees the model", all(a is b for a, b in zip(optimizer.param_groups[0]["params"], model.parameters())))
idx = torch.randint(0, 32, (2, 5), device=device)
for step in range(2):
    logits = model.head(model.block(model.emb(idx)))
    torch.nn.functional.cross_entropy(logits.view(-1, 32), idx.view(-1)).backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_tied_weights_stay_tied_and_the_optimizer_sees_the_moved_model(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(TIED)
    expected = "params 328 tied True optimizer sees the model True"  # 32*8 + 8*8 + 8: the head is the embedding
    code, cpu, err = _run(["run", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and expected in err
    code, sim, err = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and expected in err
    assert sim["coverage"]["phases"]["optimizer"] is True
    assert [p for p in sim["findings"]] == [] and sim["target"]["device"] == "cuda:0"


CUDA_SURFACE = """\
import torch

props = torch.cuda.get_device_properties(0)
print("props", props.name, props.major, props.minor, props.total_memory, props.multi_processor_count)
print("capability", torch.cuda.get_device_capability(), "count", torch.cuda.device_count(), "bf16", torch.cuda.is_bf16_supported())
torch.cuda.set_device(0)
torch.cuda.manual_seed_all(0)
before = torch.cuda.memory_allocated()
model = torch.nn.Linear(256, 256).cuda()  # 256*256*4 + 256*4 bytes
batch = torch.randn(4, 256).pin_memory().to("cuda", non_blocking=True)
print("allocated", torch.cuda.memory_allocated() - before, "peak", torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated())
free, total = torch.cuda.mem_get_info()
print("free", free < total, "total", total == props.total_memory)
stream = torch.cuda.Stream()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with torch.cuda.stream(stream):
    start.record()
    out = model(batch)
    end.record()
torch.cuda.current_stream().wait_stream(stream)
torch.cuda.synchronize()
print("elapsed", start.elapsed_time(end) >= 0, "raw stream", torch._C._cuda_getCurrentRawStream(0))
torch.cuda.reset_peak_memory_stats()
held = torch.cuda.memory_allocated()
def activations():
    return torch.empty(1024, 1024, device="cuda").sum()  # 4 MiB made and freed before anyone asks
activations()
print("after", torch.cuda.memory_allocated() - held, "peak", torch.cuda.max_memory_allocated() - held >= 4 * 2**20)
with torch.device("meta"):
    skeleton = torch.nn.Linear(4096, 4096)  # the script's own meta tensors are on no GPU
print("meta counted", torch.cuda.memory_allocated() - held)
"""


@pytest.mark.parametrize(
    ("gpu", "props", "bf16"),
    [
        ("t4", "props Tesla T4 7 5 15828320256 40", "True"),  # bf16 emulated: torch says True with emulation
        ("a100", "props NVIDIA A100-SXM4-80GB 8 0 85097971712 108", "True"),
        ("h100", "props NVIDIA H100 80GB HBM3 9 0 85017493504 132", "True"),  # what a real H100 reports
    ],
)
def test_torch_cuda_answers_as_the_gpu_profile(gpu: str, props: str, bf16: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "probe.py").write_text(CUDA_SURFACE)
    code, report, err = _run(["run", "--simulate", "--gpu", gpu, "-f", "json", "--", "python", "probe.py"], capsys)
    assert code == 0, err
    assert props in err
    major, minor = props.split()[-4:-2] if gpu != "a100" else ("8", "0")
    assert f"capability ({major}, {minor}) count 1 bf16 {bf16}" in err
    assert f"allocated {256 * 256 * 4 + 256 * 4 + 4 * 256 * 4} peak True" in err  # the weights and the batch
    assert "free True total True" in err and "elapsed True raw stream 0" in err
    # The peak follows the allocations the script made, freed or not; memory the script put on meta is on no GPU.
    assert "after 0 peak True" in err and "meta counted 0" in err
    assert report["target"]["gpu"].startswith(gpu)


FORGOT = """\
import torch

model = torch.nn.Linear(8, 4).cuda()
batch = torch.randn(2, 8)
model(batch).sum().backward()
"""


def test_a_device_mismatch_reads_in_cudas_words(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(FORGOT)
    code, report, _ = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    (finding,) = report["findings"]
    assert code == 1 and finding["code"] == "DD201"
    # CUDA's own message (c10's "Expected all tensors to be on the same device"), with the simulated device named as CUDA's.
    assert finding["pytorch_error"] == "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
    assert "meta" not in json.dumps(report).lower().replace("metadata", "")


def test_the_wording_names_the_device_the_stand_in_stands_for() -> None:
    from dtype_doctor.machine.wording import as_device

    assert as_device("Tensor on device cpu is not on the expected device meta!", "cuda:0") == (
        "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
    assert as_device("Expected all tensors to be on the same device, but found at least two devices, meta and cpu!", "cuda:1") == (
        "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cpu!")
    said = as_device("Could not run 'bnb::gemv_4bit' with arguments from the 'Meta' backend. This could be ...", "cuda:0")
    assert said is not None and said.startswith("bnb::gemv_4bit has no fake implementation") and "meta" not in said.lower()
    assert as_device("metadata of meta-llama", "cuda:0") == "metadata of meta-llama"


LIBRARY_OP = """\
import sys
import torch

namespace = sys.argv[1]  # one per run: the tests run the script several times in one process
lib = torch.library.Library(namespace, "DEF")  # a library op with a compiled kernel (here: CPU only)
lib.define("scale(Tensor x) -> Tensor")
lib.impl("scale", lambda x: x * 2, "CPU")
if "--with-fake" in sys.argv:
    torch.library.register_fake(f"{namespace}::scale")(lambda x: torch.empty_like(x))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return getattr(torch.ops, namespace).scale(self.fc(x))


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    model(torch.randn(2, 4, device=device)).sum().backward()
    optimizer.step()
"""


def test_a_library_op_uses_its_fake_impl_or_is_named_as_a_limit(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(LIBRARY_OP)
    code, cpu, _ = _run(["run", "-f", "json", "--", "python", "train.py", "ddcpu"], capsys)
    assert code == 0 and cpu["findings"] == []  # the real kernel runs
    code, report, _ = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py", "ddsim"], capsys)
    (finding,) = report["findings"]
    assert code == 0 and finding["code"] == "DD001" and finding["severity"] == "warning" and finding["op"] == "ddsim::scale"
    assert "ddsim::scale has no fake implementation" in finding["message"] and "a limit of --simulate" in finding["message"]
    assert report["coverage"]["complete"] is False and "ddsim::scale" in report["coverage"]["stopped"]
    code, report, _ = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py", "ddfake", "--with-fake"], capsys)
    assert code == 0 and report["findings"] == [] and report["coverage"]["phases"]["optimizer"] is True


def test_the_suite_scans_every_rendered_report_for_meta() -> None:
    from dtype_doctor.records import ModelInfo, Report, Target, Trace
    from dtype_doctor.report import render

    trace = Trace(ops=(), modules=(), model=ModelInfo("Net", ()), inputs=(), device="meta")
    report = Report((), Target("net", None, None, "meta", True, None, None, False), {}, trace)
    with pytest.raises(AssertionError, match="shows 'meta'"):
        render(report, "json")


PINNED = """\
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 2).cuda()
host = torch.randn(8, 4)
loader = DataLoader(TensorDataset(host, torch.zeros(8)), batch_size=4, pin_memory=True)
x, _ = next(iter(loader))
print("pinned", host.is_pinned(), host.pin_memory().is_pinned(), x.is_pinned(), file=sys.stderr)
model(x.to("cuda", non_blocking=True))
"""


def test_pinned_memory_reads_pinned_as_on_a_gpu_machine(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # On a CUDA machine pin_memory() hands out a page-locked copy and DataLoader(pin_memory=True) pins its batches
    # (torch/utils/data/_utils/pin_memory.py); the host tensor itself stays unpinned. Here there is no accelerator:
    import torch

    with pytest.raises(RuntimeError):
        torch.randn(2).pin_memory()
    (workdir / "train.py").write_text(PINNED)
    code, report, err = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and report is not None and report["findings"] == [], err
    assert "pinned False True True" in err


PRINTED = """\
import sys
import torch

model = torch.nn.Linear(4, 2).to(0)
x = torch.randn(3, 4).to(0)
logits = model(x)
print("logits", logits, file=sys.stderr)
print("at", logits.device, logits.is_cuda, file=sys.stderr)
logits.sum().backward()
"""


def test_a_tensor_printed_during_the_step_reads_as_cuda(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # On a GPU machine `print(logits)` ends in device='cuda:0'; the stand-in must never show as meta, before the
    # step, in it (where the trace opens torch functions) or after.
    (workdir / "train.py").write_text(PRINTED)
    code, report, err = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and report is not None, err
    assert "device='cuda:0')" in err and "meta" not in err and "at cuda:0 True" in err, err
