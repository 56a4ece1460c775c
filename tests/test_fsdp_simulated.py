"""FSDP2 over a simulated load: `fully_shard` of a model whose parameters are fake tensors traces
as the same model with real weights does (the cluster benchmark's 8B at world 64 is this, larger)."""

import contextlib
from pathlib import Path

import pytest
import torch

import dtype_doctor
from dtype_doctor.machine.placement import Placement
from dtype_doctor.load import load_model

LLAMA_TINY = str(Path(__file__).resolve().parents[1] / "fixtures" / "models" / "llama-tiny")


def _sharded_step(simulate: bool, reduce_dtype: torch.dtype | None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    loaded = load_model(LLAMA_TINY, placement=Placement("cpu", simulated=simulate), dtype="bfloat16")
    model = loaded.model
    with dtype_doctor.fake_world(4) as mesh, (loaded.fake_mode or contextlib.nullcontext()):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        ids = torch.zeros(1, 8, dtype=torch.long)
        return dtype_doctor.diagnose(model, {"input_ids": ids, "labels": ids}, train=True)


@pytest.mark.parametrize("reduce_dtype", [torch.float32, None], ids=["fp32-reduce", "bf16-reduce"])
def test_fake_sharded_model_traces_as_the_real_one(reduce_dtype):
    fake, real = _sharded_step(True, reduce_dtype), _sharded_step(False, reduce_dtype)
    assert fake.trace.failure is None and fake.trace.simulated
    collectives = [[(op.op, op.operands[0].dtype) for op in r.trace.ops if op.op.startswith("c10d.")] for r in (fake, real)]
    assert collectives[0] == collectives[1] and any("reduce_scatter" in name for name, _ in collectives[0])
    assert sorted(f.code for f in fake.findings) == sorted(f.code for f in real.findings)
    assert ("DD603" in {f.code for f in fake.findings}) == (reduce_dtype is None)
