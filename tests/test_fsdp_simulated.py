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


def test_values_under_a_fake_process_group_are_not_called_measured():
    """torch's fake process group moves no data: a 2-rank fully_shard'ed model computes with this rank's
    shard and stale memory for the other's (the plain forward differs from the same weights unsharded).
    So a trace there measures no values, says why, and keeps no statistics a rule could judge."""
    import copy

    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    unsharded = model(x).detach()
    with dtype_doctor.fake_world(2) as mesh:
        sharded = copy.deepcopy(model)
        fully_shard(sharded, mesh=mesh)
        assert not torch.allclose(sharded(x).detach(), unsharded)  # the plain behaviour: not the step's values
        report = dtype_doctor.diagnose(sharded, {"input": x}, train=True)
    values = report.to_dict()["values"]
    assert values["measured"] is False and "fake process group stood in for ranks 1 to 1" in values["note"]
    assert all(op.stats is None and op.operand_stats is None for op in report.trace.ops)
    assert all(m.stats is None for m in report.trace.modules) and not report.trace.grads
    with dtype_doctor.fake_world(1):  # one rank: every collective is the identity, the values are real
        alone = copy.deepcopy(model)
        assert dtype_doctor.diagnose(alone, {"input": x}).trace.values_measured
