"""A sample of benchmarks/sweep_whole_step.py in CI: one training step of representative families,
pure bfloat16 and float16, simulated for an A100 (sm80) through the sweep's own code path.

Each step runs for real on this CPU first (plain PyTorch: forward, loss, backward, AdamW step);
where it runs, the simulated step (diagnose(train=True, simulate=True) and the optimizer's step)
has no error finding. The families cover each normalisation a backward reads saved statistics
of: LayerNorm (bert), a Python RMSNorm (llama), BatchNorm after a conv (resnet), GroupNorm with a
weight-normed conv (wav2vec2), an encoder-decoder (t5), and the state-space scans: Mamba-2's chunked
scan (mamba2) and a hybrid of attention, Mamba and experts (jamba).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from helpers_errors import raises_dtype_error

SWEEP = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_whole_step.py"


@pytest.fixture(scope="module")
def sweep():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("sweep_whole_step", SWEEP)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sweep_whole_step", module)
    spec.loader.exec_module(module)
    import transformers

    transformers.logging.set_verbosity_error()
    return module


def test_a_naive_cpu_probe_of_layer_norm_backward_refuses_what_cudas_forward_saved() -> None:
    """The false error the sweep found first: this CPU's layer norm saves bf16 statistics, CUDA's
    (and the simulation's fake kernel) float32 ones, which this CPU's backward refuses."""
    x, w = torch.rand(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, None, 1e-5)
    assert mean.dtype == torch.bfloat16
    assert torch.ops.aten.native_layer_norm(x.to("meta"), [8], w.to("meta"), None, 1e-5)[1].dtype == torch.float32
    with raises_dtype_error("float32"):
        torch.ops.aten.native_layer_norm_backward(x, x, [8], mean.float(), rstd.float(), w, None, [True, True, False])


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("family", ["bert", "llama", "resnet", "wav2vec2", "t5", "mamba2", "jamba"])
def test_a_clean_real_step_is_a_clean_simulated_step(sweep, family: str, precision: str) -> None:  # noqa: ANN001
    fam = sweep.FAMILIES[family]
    dtype, autocast = sweep.PRECISIONS[precision]
    model = sweep.build(fam, dtype)
    inputs = sweep.batch(fam, model, dtype)
    real = sweep.real_step(model, inputs, autocast)
    assert real.raised is None, real.raised
    simulated = sweep.simulated_step(model, inputs, autocast, "a100")
    assert simulated.errors == () and simulated.limits == (), (simulated.errors, simulated.limits)
    verdict, _ = sweep.judge(fam, precision, "a100", real, simulated)
    assert verdict == "agree"
