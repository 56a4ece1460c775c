"""A simulated step runs to its end: stand-in values where the script reads one, the step ends
where a GPU's step ends (`--steps` counts optimizer steps), and every report says what it covered.

PyTorch is the oracle: each script also runs on the real CPU (`run` without --simulate), where it
reads real values; the simulation must take the branch that real, healthy run takes.
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
    return exit_info.value.code, (json.loads(captured.out) if captured.out.strip().startswith("{") else None), captured.out + captured.err


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# A loop as users write it: log loss.item(), skip a non-finite loss, GradScaler, accumulate two micro-batches.
LOOP = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=device == "cuda")
x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
for step in range(4):
    for micro in range(2):
        with torch.autocast("cuda", dtype=torch.float16, enabled=device == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)) / 2
        if not torch.isfinite(loss):
            print("skipping a non-finite loss")
            continue
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale()}")
"""


def _where(report: dict, line: int) -> list[tuple[str, str]]:
    return [(s["what"], s["value"]) for s in report["stand_ins"] if s["source"] and s["source"]["line"] == line]


def test_a_loop_that_reads_values_is_traced_to_its_optimizer_step(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(LOOP)
    code, cpu, out = _run(["run", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and "step 0 loss" in out and "skipping" not in out  # the real run: finite loss, the optimizer steps
    assert cpu["stand_ins"] == [] and cpu["coverage"]["phases"] == {"forward": True, "loss": True, "backward": True, "optimizer": True}
    code, sim, out = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and "skipping" not in out and "step 0 loss 1.0000 scale 65536.0" in out and "step 1" not in out
    assert sim["coverage"]["phases"] == {"forward": True, "loss": True, "backward": True, "scaler": True, "optimizer": True}
    assert sim["coverage"]["complete"] is True and sim["coverage"]["steps"] == 1 and sim["coverage"]["stopped"] is None
    assert sim["coverage"]["modules_called"] == sim["coverage"]["modules_total"] == 4
    # Each read is listed with the user's line and the value taken: the healthy branch.
    assert _where(sim, 13) == [("Tensor.__bool__", "True")]  # torch.isfinite(loss): finite
    assert _where(sim, 17) == [("Tensor.item", "0.0")]  # GradScaler's found-inf: none, the optimizer steps
    assert set(_where(sim, 20)) == {("Tensor.item", "1.0"), ("Tensor.item", "65536.0")}  # loss.item(), get_scale()
    assert sim["coverage"]["stand_ins"] == len(sim["stand_ins"]) == 4


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_the_plain_loop_on_every_gpu_profile(gpu: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(LOOP)
    code, report, out = _run(["run", "--simulate", "--gpu", gpu, "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and report["findings"] == [] and report["coverage"]["complete"] is True
    assert report["coverage"]["phases"]["scaler"] is True and report["target"]["gpu"].startswith(gpu)


def test_steps_count_optimizer_steps(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(LOOP)
    code, report, out = _run(["run", "--simulate", "--steps", "2", "-f", "json", "--", "python", "train.py"], capsys)
    # Two optimizer steps of two micro-batches each: four forwards traced, the fifth stopped.
    assert code == 0 and "step 1 loss" in out and "step 2" not in out
    assert report["coverage"]["steps"] == 2 and report["summary"]["ops_traced"] > 0


def test_the_rich_report_lists_stand_ins_and_coverage(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(LOOP)
    code, _, out = _run(["run", "--simulate", "--", "python", "train.py"], capsys)
    assert code == 0 and "stand-in values" in out and "train.py:17" in out and "65536.0" in out
    flat = " ".join(out.split())  # however wide the console, the line may wrap
    assert "coverage: forward ✓ loss ✓ backward ✓ scaler ✓ optimizer ✓ · 4 of 4 modules called" in flat


# Data-dependent sizes: the selection keeps autograd, so the backward reaches the model.
SIZES = """\
import torch

model = torch.nn.Linear(4, 3).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
labels = torch.tensor([0, -100, 2, 1]).cuda()
keep = labels != -100
logits = model(torch.randn(4, 4).cuda())
loss = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
print("kept", logits[keep].shape, torch.nonzero(keep).shape, torch.unique(labels).shape, logits.masked_select(keep[:, None]).shape)
loss.backward()
optimizer.step()
"""


def test_data_dependent_sizes_take_every_element(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(SIZES)
    code, report, out = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and "kept torch.Size([4, 3]) torch.Size([4, 1]) torch.Size([4]) torch.Size([12])" in out
    assert report["coverage"]["phases"]["backward"] is True and report["coverage"]["phases"]["optimizer"] is True
    sizes = {s["what"]: s["value"] for s in report["stand_ins"]}
    assert sizes["boolean indexing (its size)"] == "4 (every element selected)"
    assert {"torch.nonzero (its size)", "torch.unique (its size)", "torch.masked_select (its size)"} <= set(sizes)


# The evaluation before the first iteration (nanoGPT's estimate_loss) reads loss.item() under no_grad.
EVAL_FIRST = """\
import torch

model = torch.nn.Linear(4, 2).cuda().half()
optimizer = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda")


@torch.no_grad()
def estimate_loss():
    losses = torch.zeros(3)
    for k in range(3):
        losses[k] = model(torch.randn(2, 4).cuda().half()).float().pow(2).mean().item()
    return losses.mean()


print("val", estimate_loss())
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(torch.randn(2, 4).cuda()).float().pow(2).mean()
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
"""


def test_an_evaluation_before_training_is_stepped_through_to_the_grad_scaler(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(EVAL_FIRST)
    code, report, out = _run(["run", "--simulate", "--gpu", "t4", "-f", "json", "--", "python", "train.py"], capsys)
    # Half weights under a GradScaler: the T4 dies of "Attempting to unscale FP16 gradients".
    assert code == 1 and [f["code"] for f in report["findings"] if f["severity"] == "error"] == ["DD401"]
    assert ("Tensor.item", "1.0") in _where(report, 12)
    assert report["coverage"]["phases"]["backward"] is True and report["coverage"]["phases"]["scaler"] is True


def test_a_partial_trace_says_what_it_covered(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2).cuda()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss = model(torch.randn(2, 4).cuda()).sum()\nraise SystemExit('out of patience')\n"
    )
    code, _, out = _run(["run", "--simulate", "--", "python", "train.py"], capsys)
    assert "no dtype or device problems found" not in out
    assert "no findings in what was traced (forward; not reached: loss, backward, optimizer)" in out


def test_diagnose_reports_carry_coverage_and_stand_ins() -> None:
    import torch

    import dtype_doctor

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - the model's input name
            out = self.fc(input)
            return torch.nn.functional.gaussian_nll_loss(out, torch.zeros_like(out), out.exp())  # checks `any(var < 0)`

    d = dtype_doctor.diagnose(Net(), {"input": torch.randn(2, 4)}, simulate=True, device="cuda", train=True).to_dict()
    assert d["coverage"]["phases"] == {"forward": True, "loss": True, "backward": True} and d["coverage"]["complete"] is True
    assert d["coverage"]["modules_called"] == d["coverage"]["modules_total"] == 2
    assert [(s["what"], s["value"]) for s in d["stand_ins"]] == [("Tensor.__bool__", "False")]
    real = dtype_doctor.diagnose(Net(), {"input": torch.randn(2, 4)}, train=True).to_dict()
    assert real["stand_ins"] == [] and real["coverage"]["complete"] is True


# trl's GRPO after generate: a completion mask made on the device, copied to the host, each row selected by it.
MASKED_ROWS = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = torch.nn.Linear(8, 8).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(2, 4, 8, device=device)
loss = model(x).pow(2).mean()
ids = model(x).argmax(-1).detach()
is_eos = ids == 7
eos_idx = torch.full((2,), 4, dtype=torch.long, device=device)
eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
mask = (torch.arange(4, device=device).expand(2, -1) <= eos_idx.unsqueeze(1)).int()
completions = [c[m].tolist() for c, m in zip(ids.cpu(), mask.bool().cpu())]
print("last tokens", [c[-1] for c in completions])
loss.backward()
optimizer.step()
"""


def test_a_mask_copied_to_the_host_selects_every_element(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(MASKED_ROWS)
    # On the real CPU every row keeps at least its first token (eos_idx >= 0), so `c[-1]` exists.
    code, report, out = _run(["run", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and "last tokens" in out, out[-2000:]
    # Simulated, the mask holds no values: an all-False stand-in would empty each row and `c[-1]` raise IndexError.
    code, report, out = _run(["run", "--simulate", "-f", "json", "--", "python", "train.py"], capsys)
    assert code == 0 and "last tokens [0, 0]" in out, out[-2000:]
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert any(s["what"] == "Tensor.cpu" and s["value"] == "a [2, 4] bool tensor of True" for s in report["stand_ins"])
