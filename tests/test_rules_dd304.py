"""DD304 inductor-skips-half-rounding, and coverage.compiled: the regions torch.compile would have
compiled, which a trace runs eagerly.

PyTorch first: eager rounds each bfloat16 op's result; inductor fuses `(x * y + 1) * y` into one
kernel and keeps `x * y` in float32 (torch/_inductor/config.py, emulate_precision_casts), so the
compiled result differs, and with the knob on it matches eager bit for bit.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from dtype_doctor.fix.strategies import worded
from dtype_doctor.records import CompiledRegion, ModelInfo, OpCall, TensorMeta, Trace, Coverage, SourceLoc
from dtype_doctor.rules.dd304_inductor_skips_half_rounding import check


def _fused(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y + 1.0) * y


@pytest.mark.slow  # a cold inductor compile takes a minute and a half on two cores
def test_inductor_skips_the_rounding_eager_does_between_fused_bf16_ops() -> None:
    import torch._dynamo
    import torch._inductor.config as inductor

    torch.manual_seed(0)
    x, y = torch.randn(4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    eager = _fused(x, y)
    torch._dynamo.reset()
    assert not torch.equal(torch.compile(_fused)(x, y), eager)
    torch._dynamo.reset()
    with inductor.patch(emulate_precision_casts=True):
        assert torch.equal(torch.compile(_fused)(x, y), eager)
    torch._dynamo.reset()


def _meta(dtype: str) -> TensorMeta:
    return TensorMeta(role="output", name=None, dtype=dtype, device="cpu", shape=(4,))


def _trace(region: CompiledRegion, dtype: str = "bfloat16") -> Trace:
    ops = tuple(OpCall(i, op, "_orig_mod", "Gated", (_meta(dtype),), (_meta(dtype),)) for i, op in
                enumerate(("aten.sigmoid.default", "aten.mul.Tensor", "aten.addmm.default")))
    coverage = Coverage(("forward",), ("forward",), 1, 1, len(ops), compiled=(region,))
    return Trace(ops=ops, modules=(), model=ModelInfo("OptimizedModule", ()), inputs=(), coverage=coverage)


REGION = CompiledRegion("Gated", "module", "", "inductor", called=True, source=SourceLoc("train.py", 9))


@pytest.mark.parametrize(("region", "dtype", "found"), [
    (REGION, "bfloat16", True),
    (REGION, "float32", False),  # float32 ops: nothing to round
    (CompiledRegion("Gated", "module", "", "aot_eager", called=True), "bfloat16", False),  # no inductor, no fusion
    (CompiledRegion("Gated", "module", "", "inductor", emulate_precision_casts=True, called=True), "bfloat16", False),
    (CompiledRegion("Gated", "module", "", "inductor", called=False), "bfloat16", False),  # not in the step
], ids=["bf16", "fp32", "aot_eager", "emulated", "not-called"])
def test_the_rule_reads_the_regions_and_their_half_elementwise_ops(region: CompiledRegion, dtype: str, found: bool) -> None:
    findings = list(worded(check(_trace(region, dtype))))
    assert bool(findings) == found
    if found:
        [f] = findings
        assert f.severity == "warning" and f.source == SourceLoc("train.py", 9) and "in Gated" in f.message
        assert "mul, sigmoid" in f.message and "TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1" in f.fixes[0].description


SCRIPT = textwrap.dedent("""
    import sys
    import torch

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.sigmoid(self.gate(x)) * self.up(x)  # two elementwise ops inductor fuses

    model = Gated().to(torch.bfloat16)
    options = {"emulate_precision_casts": True} if "--emulate" in sys.argv else None
    model = torch.compile(model, options=options)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(2):
        model(torch.randn(4, 16, dtype=torch.bfloat16)).float().sum().backward()
        opt.step()
        opt.zero_grad()
""")


@pytest.mark.parametrize("emulate", [False, True], ids=["default", "emulated"])
def test_a_compiled_bf16_script_is_traced_eagerly_and_said_so(emulate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    from dtype_doctor.cli.main import run

    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run(["run", "-f", "json", "--", "python", "train.py", *(["--emulate"] if emulate else [])])
    report = json.loads(capsys.readouterr().out)
    [region] = report["coverage"]["compiled"]
    assert region == {"target": "Gated", "kind": "module", "module": "", "backend": "inductor", "mode": None,
                      "emulate_precision_casts": emulate, "called": True, "traced": "eagerly",
                      "source": {"file": "train.py", "line": SCRIPT.splitlines().index(
                          "model = torch.compile(model, options=options)") + 1}}
    dd304 = [f for f in report["findings"] if f["code"] == "DD304"]
    assert bool(dd304) != emulate
