"""`dtype-doctor run --simulate --device cuda`: a CUDA training script checked on a CPU-only machine.

The script sees a CUDA machine; its CUDA tensors hold no data. Each test runs a small real
script, under the simulation and (where the verdicts must agree) on the CPU as well.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_cli import run_json


_run = run_json


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _script(workdir: Path, text: str, name: str = "train.py") -> str:
    (workdir / name).write_text(text)
    return name


def _codes(report: dict, severity: str = "error") -> list[str]:
    return [f["code"] for f in report["findings"] if f["severity"] == severity]


CUDA_API = """\
import torch

print("available", torch.cuda.is_available(), "count", torch.cuda.device_count(), "bf16", torch.cuda.is_bf16_supported(),
      "native", torch.cuda.is_bf16_supported(including_emulation=False))
device = torch.device("cuda")
model = torch.nn.Linear(8, 4).cuda()
head = torch.nn.Linear(4, 2, device="cuda")
x = torch.randn(2, 8).to("cuda")
with torch.device("cuda"):
    bias = torch.zeros(2)
scaler = torch.cuda.amp.GradScaler()
print("scaler", scaler.is_enabled())
print("params", {p.device.type for p in [*model.parameters(), *head.parameters()]}, "x", x.device.type, "bias", bias.device.type)
print("x on", x.device, "is_cuda", x.is_cuda, "is_meta", x.is_meta, "get_device", x.get_device(), "type", x.type())
with torch.device("meta"):  # the script's own empty init stays on meta
    skeleton = torch.nn.Linear(8, 4)
print("skeleton", skeleton.weight.device, skeleton.weight.is_meta)
if x.device.type == "cuda":  # a script that branches on the device takes its CUDA branch
    print("cuda branch")
for step in range(2):
    out = head(model(x)) + bias
    print("step", step, "out", out.shape)
"""


def test_the_script_sees_a_cuda_machine(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", _script(workdir, CUDA_API)], capsys)
    # A T4 as torch sees one: bfloat16 runs (emulated), but not natively (compute capability 7.5).
    assert "available True count 1 bf16 True native False" in err
    assert "scaler True" in err  # GradScaler is on, as on a GPU
    # Every placement landed on the data-less stand-in, which the script reads as the CUDA device it stands for.
    assert "params {'cuda'} x cuda bias cuda" in err
    assert "x on cuda:0 is_cuda True is_meta False get_device 0 type torch.cuda.FloatTensor" in err and "cuda branch" in err
    assert "skeleton meta True" in err
    assert "step 0 out torch.Size([2, 2])" in err and "step 1" not in err  # stopped before step 2
    assert code == 0 and report["target"]["device"] == "cuda:0" and report["target"]["simulated"] is True
    assert report["target"]["gpu"].startswith("t4")
    assert report["environment"]["cuda_available"] is False
    assert {s["device"] for chain in report["lineage"].values() for s in chain[-1:]} == {"cuda:0"}


# The batch left on the CPU: real CUDA raises "Expected all tensors to be on the same device".
FORGOT_TO_MOVE = """\
import torch

model = torch.nn.Linear(8, 4)
if torch.cuda.is_available():
    model.cuda()
batch = torch.randn(2, 8)
for step in range(2):
    model(batch).sum().backward()
"""


def test_a_batch_left_on_the_cpu_is_found_only_when_the_target_is_cuda(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, FORGOT_TO_MOVE)
    code, report, _ = _run(["run", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and _codes(report) == []  # on this CPU machine everything is on the CPU
    code, report, _ = _run(["run", "--simulate", "-f", "json", "--", "python", script], capsys)
    assert code == 1 and _codes(report) == ["DD201"]
    (finding,) = report["findings"]
    assert {t["device"] for t in finding["tensors"]} == {"cpu", "cuda:0"}
    assert finding["source"] == {"file": script, "line": 6}  # where the batch was made


# nanoGPT's sample.py with `model.to(device)` dropped: the prompt made on the GPU, the model's tables on the CPU.
MODEL_LEFT_BEHIND = """\
import torch

model = torch.nn.Embedding(10, 4)
model.eval()
idx = torch.tensor([[1, 2]], device="cuda")
with torch.no_grad():
    print(model(idx).shape)
"""


def test_a_cuda_index_into_a_cpu_table_is_refused_as_cuda_refuses_it(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    import torch

    # The meta stand-in does not refuse it: a meta index into a CPU table returns a CPU tensor of uninitialised
    # values. CUDA's generated wrapper checks the common device of self and index (check_and_update_common_device,
    # wrapper_CUDA__index_select) and refuses, so the simulation must say so itself.
    assert torch.nn.functional.embedding(torch.tensor([1], device="meta"), torch.randn(10, 4)).device.type == "cpu"
    code, report, _ = _run(["run", "--simulate", "-f", "json", "--", "python", _script(workdir, MODEL_LEFT_BEHIND)], capsys)
    assert code == 1 and _codes(report) == ["DD201"], report["findings"]
    assert {t["device"] for t in report["findings"][0]["tensors"]} == {"cpu", "cuda:0"}


# fp32 activations meet an fp16 weight outside autocast: refused on CPU and CUDA alike.
AGREE = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to(device)
model[1].half()
labels = torch.tensor([0, 1], dtype=torch.int32, device=device)
for step in range(2):
    logits = model(torch.randn(2, 8, device=device))
    torch.nn.functional.cross_entropy(logits.float(), labels).backward()
"""


def test_verdicts_agree_with_the_cpu_where_cpu_and_cuda_agree(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, AGREE)
    _, cpu, _ = _run(["run", "-f", "json", "--", "python", script], capsys)
    _, cuda, _ = _run(["run", "--simulate", "-f", "json", "--", "python", script], capsys)
    assert _codes(cpu) == _codes(cuda) == ["DD101", "DD104"]
    assert cpu["target"]["device"] == "cpu" and cuda["target"]["device"] == "cuda:0"
    target = lambda r: next(f for f in r["findings"] if f["code"] == "DD104")  # noqa: E731
    assert target(cpu)["source"] == target(cuda)["source"] == {"file": script, "line": 6}


# A half model fed fp32 under autocast("cuda"): CUDA's autocast casts the input to fp16 for the
# matmuls; on this CPU machine autocast("cuda") is turned off and the matmul is refused.
AUTOCAST = """\
import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2)).half()
device = "cuda" if torch.cuda.is_available() else "cpu"
model.to(device)
for step in range(2):
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(torch.randn(2, 8, device=device))
    print("out", out.dtype)
"""


def test_autocast_cuda_applies_cudas_lists(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, AUTOCAST)
    code, cpu, _ = _run(["run", "-f", "json", "--", "python", script], capsys)
    assert code == 1 and "DD101" in _codes(cpu) and cpu["target"]["autocast"] is None
    code, cuda, err = _run(["run", "--simulate", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and _codes(cuda) == [] and cuda["target"]["autocast"] == "float16"
    assert "out torch.float16" in err


def test_bfloat16_autocast_on_a_gpu_without_bf16_tensor_cores_runs_as_on_that_gpu(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, AUTOCAST.replace("torch.float16)", "torch.bfloat16)"))
    code, report, err = _run(["run", "--simulate", "--gpu", "a100", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and report["target"]["autocast"] == "bfloat16"
    assert "DD107" not in {f["code"] for f in report["findings"]}
    # On a T4 torch's autocast asks is_bf16_supported(), which is True with emulation: the step
    # runs, and DD107 warns that its bfloat16 matmuls have no tensor cores there.
    code, report, err = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and report["target"]["autocast"] == "bfloat16"
    assert {f["severity"] for f in report["findings"] if f["code"] == "DD107"} == {"warning"}


# The script reads a value every step (loss.item()): it gets a stand-in and goes on.
READS_A_VALUE = """\
import torch

model = torch.nn.Linear(8, 2).cuda()
for step in range(3):
    loss = model(torch.randn(4, 8).cuda()).float().pow(2).mean()
    loss.backward()
    print("step", step)
    print("loss", loss.item())
"""


def test_a_value_read_gets_a_stand_in_and_the_steps_go_on(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, READS_A_VALUE)
    code, report, err = _run(["run", "--simulate", "--steps", "2", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and report["target"]["train"] is True and "trace_failure" not in report
    # No optimizer: --steps counts forward calls; both steps ran, the third was stopped.
    assert "step 1" in err and "loss 1.0" in err and "step 2" not in err
    assert report["stand_ins"] == [{"what": "Tensor.item", "value": "1.0", "why": "a finite value (simulated tensors hold none)",
                                    "source": {"file": script, "line": 8}}]
    assert report["coverage"]["steps"] == 2 and report["coverage"]["complete"] is True
    _script(workdir, READS_A_VALUE.replace('    print("loss", loss.item())\n', ""))
    code, report, err = _run(["run", "--simulate", "--steps", "2", "--keep-running", "-f", "json", "--", "python", script], capsys)
    assert "step 1" in err and "step 2" not in err and report["stand_ins"] == []
    assert "--keep-running: a simulated script cannot go on" in err


def test_a_value_read_before_the_model_gets_a_stand_in(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, "import torch\nx = torch.ones(2, 2).cuda()\nif x.sum() > 1:\n    print('big')\n"
                              "torch.nn.Linear(2, 2).cuda()(x)\n")
    code, report, err = _run(["run", "--simulate", "-f", "json", "--", "python", script], capsys)
    assert code == 0 and "big" not in err  # a bare condition on values is taken as not holding
    (stand_in,) = report["stand_ins"]
    assert stand_in["what"] == "Tensor.__bool__" and stand_in["value"] == "False" and stand_in["source"] == {"file": script, "line": 3}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--simulate", "--device", "cpu"], "--device cpu contradicts it"),
        (["--gpu", "t4"], "add --simulate"),
        (["--simulate", "--gpu", "z9"], "unknown --gpu 'z9'"),
    ],
)
def test_bad_simulation_options_are_usage_errors(argv: list[str], says: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    script = _script(workdir, "import torch\ntorch.nn.Linear(2, 2)(torch.ones(1, 2))\n")
    code, _, err = _run(["run", *argv, "--", "python", script], capsys)
    assert code == 2 and says in err


RESUME = """\
import torch

model = torch.nn.Linear(8, 4)
checkpoint = torch.load("ckpt.pt", map_location="cuda")  # nanoGPT's resume: the checkpoint onto the GPU
print("loaded on", checkpoint["model"]["weight"].device)
model.load_state_dict(checkpoint["model"])  # a host model filled from CUDA tensors
model.to("cuda")
for step in range(2):
    model(torch.randn(2, 8, device="cuda")).sum().backward()
"""


def test_a_checkpoint_loaded_onto_cuda_resumes(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    """A CPU-only torch refuses map_location="cuda" ("Attempting to deserialize object on a CUDA device");
    the simulated machine loads it onto its data-less CUDA, and the host copy takes stand-in values."""
    import torch

    torch.save({"model": torch.nn.Linear(8, 4).state_dict()}, workdir / "ckpt.pt")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(workdir / "ckpt.pt", map_location="cuda")
    code, report, err = _run(["run", "--simulate", "-f", "json", "--", "python", _script(workdir, RESUME)], capsys)
    assert code == 0 and "loaded on cuda:0" in err and report["coverage"]["complete"]
    assert {s["what"] for s in report["stand_ins"]} == {"Tensor.copy_ (from CUDA)"}
