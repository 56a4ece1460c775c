"""DD112 half-precision-reduction: a loss or a statistic computed in float16/bfloat16.

PyTorch first: torch.quantile refuses half input, cross_entropy in bf16 runs and returns a bf16
loss that differs from float32 on the very same logits. Then the doctor: the finding, the user's
line, the fix (autocast, or .float() before the loss) and the re-trace that is clean.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from helpers_models import found, load_fixture, token_batch

VOCAB = 4096


def _line(needle: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line and "_line(" not in line)


class LanguageHead(nn.Module):
    """A head and its loss in one forward, as a custom training module has them."""

    def __init__(self, vocab: int = VOCAB) -> None:
        super().__init__()
        self.head = nn.Linear(16, vocab)

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        return F.cross_entropy(logits, labels)  # the loss line


class Quantiles(nn.Module):
    """Embeddings and a robust scale, as sentence-transformers-style pooling computes one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        emb = self.proj(hidden)
        scale = torch.quantile(emb, 0.9, dim=-1, keepdim=True)  # the quantile line
        return emb / scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantile_refuses_half_precision(dtype: torch.dtype) -> None:
    x = torch.randn(4, 32).to(dtype)
    with pytest.raises(RuntimeError):
        torch.quantile(x, 0.5)
    torch.quantile(x.float(), 0.5)  # float32 is accepted

    model = Quantiles().to(dtype)
    report = dtype_doctor.diagnose(model, {"hidden": torch.randn(2, 16).to(dtype)})
    [f] = found(report, "DD112")
    assert (f.severity, f.op, f.stage) == ("error", "torch.quantile", "model-code")
    assert f.pytorch_error is not None
    assert f.source is not None and f.source.line == _line("# the quantile line")
    assert [t.dtype for t in f.tensors] == [str(dtype).removeprefix("torch.")]
    # the refusal is DD112's, not DD100's catch-all, and the trace went on past it
    assert found(report, "DD100") == [] and report.trace.failure is None
    assert any(".float()" in fx.description for fx in f.fixes)


def test_cross_entropy_in_bf16_runs_and_diverges_from_fp32() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, VOCAB, generator=gen) * 3).bfloat16()
    labels = torch.randint(0, VOCAB, (64,), generator=gen)
    half = F.cross_entropy(logits, labels, reduction="none")
    full = F.cross_entropy(logits.float(), labels, reduction="none")  # the same rounded logits, in fp32
    assert half.dtype == torch.bfloat16  # nothing raises: the loss is silently bf16
    # measured on this batch: per-token losses off by up to ~0.07 (bf16 steps of 0.0625 at 8-16)
    assert 0.01 < (half.float() - full).abs().max().item() < 0.2


def test_half_loss_in_a_custom_forward_is_found_with_its_line() -> None:
    model = LanguageHead().bfloat16()
    batch = {"hidden": torch.randn(8, 16).bfloat16(), "labels": torch.randint(0, VOCAB, (8,))}
    assert model(**batch).dtype == torch.bfloat16
    report = dtype_doctor.diagnose(model, batch)
    [f] = found(report, "DD112")  # one cross_entropy: log_softmax and nll_loss are one finding
    assert (f.severity, f.stage, f.op) == ("warning", "loss", "aten.nll_loss_forward.default")
    assert "cross_entropy" in f.message and "bfloat16" in f.message
    assert f.source is not None and f.source.line == _line("# the loss line")
    assert {r.strategy for r in f.remedies} == {"autocast"}
    # the fix: fp32 weights under autocast put the loss in float32, and the trace is clean
    fixed = dtype_doctor.diagnose(LanguageHead(), batch | {"hidden": batch["hidden"].float()}, autocast="bfloat16")
    assert found(fixed, "DD112") == []


def test_fp32_loss_is_clean() -> None:
    batch = {"hidden": torch.randn(8, 16), "labels": torch.randint(0, VOCAB, (8,))}
    assert found(dtype_doctor.diagnose(LanguageHead(), batch), "DD112") == []


def test_transformers_upcasts_its_own_loss() -> None:
    """LlamaForCausalLM's loss casts the logits to float32 first: nothing to report."""
    model = load_fixture("llama-tiny", dtype=torch.bfloat16)
    batch = token_batch(vocab=600)
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    report = dtype_doctor.diagnose(model, {**batch, "labels": batch["input_ids"]})
    assert found(report, "DD112") == []


def test_statistics_are_info_and_long_softmax_in_fp16_a_warning() -> None:
    class Stats(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.var(-1).sum() + x.norm(dim=-1).sum() + F.softmax(x, -1).sum()

    report = dtype_doctor.diagnose(Stats(), {"x": torch.randn(2, 2048).bfloat16()})
    by_op = {f.op: f.severity for f in found(report, "DD112")}
    assert by_op == {"aten.var.correction": "info", "aten.linalg_vector_norm.default": "info",
                     "aten._softmax.default": "info"}
    # fp16: the statistics keep 11 bits (not reported); the long softmax flushes small probabilities to 0
    report = dtype_doctor.diagnose(Stats(), {"x": (torch.randn(2, 2048) * 8).half()})
    assert {f.op: f.severity for f in found(report, "DD112")} == {"aten._softmax.default": "warning"}
    assert (F.softmax((torch.randn(2, 2048) * 8).half(), -1) == 0).any()  # measured: underflow to exactly 0
    # a short softmax (a head's keys) is no finding
    assert found(dtype_doctor.diagnose(Stats(), {"x": torch.randn(2, 64).half()}), "DD112") == []


def test_fp16_cross_entropy_over_few_classes_is_not_reported() -> None:
    """fp16 keeps 11 bits: a classifier's loss is within 2**-11 of float32; bf16 is 8 times coarser."""
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(4096, 3, generator=gen) * 3, torch.randint(0, 3, (4096,), generator=gen)

    def off(dtype: torch.dtype) -> float:  # against float32 on the same rounded logits
        half = logits.to(dtype)
        return (F.cross_entropy(half, labels, reduction="none").float() - F.cross_entropy(half.float(), labels, reduction="none")).abs().max().item()

    assert off(torch.float16) < 0.01 < off(torch.bfloat16)  # measured: 0.0044 and 0.034
    batch = {"hidden": torch.randn(8, 16).half(), "labels": torch.randint(0, 3, (8,))}
    assert found(dtype_doctor.diagnose(LanguageHead(vocab=3).half(), batch), "DD112") == []


SCRIPT = """\
import torch
import torch.nn.functional as F

model = torch.nn.Linear(16, 512).to(torch.bfloat16)
hidden = torch.randn(4, 16, dtype=torch.bfloat16)
labels = torch.randint(0, 512, (4,))
logits = model(hidden)
loss = F.cross_entropy(logits, labels)
loss.backward()
print("loss dtype", loss.dtype)
"""


def test_run_names_the_scripts_loss_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from dtype_doctor.cli.main import run

    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run(["run", "--format", "json", "--fail-on", "never", "--", "python", "train.py"])
    captured = capsys.readouterr()
    assert "loss dtype torch.bfloat16" in captured.err  # the script's own step ran
    [f] = [f for f in json.loads(captured.out)["findings"] if f["code"] == "DD112"]
    assert f["source"] == {"file": "train.py", "line": 8}
    # the loss is the script's, after the forward: autocast around the forward would not reach it
    assert [x["strategy"] for x in f.get("remedies", [])] == []
    assert any(".float()" in x["description"] for x in f["fixes"])
