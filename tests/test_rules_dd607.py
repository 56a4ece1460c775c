"""DD607 fsdp1-plain-grad-scaler: a training loop's GradScaler class against its FSDP wrapping, traced as
rank 0 of a torchrun line. The real 2-rank gloo run (tests/test_fsdp_oracle.py) shows the harm: with
FSDP1 and a plain GradScaler an overflow in one rank's shard leaves the ranks with different scales;
ShardedGradScaler, and FSDP2 with a plain GradScaler, keep them equal."""

import textwrap

import dataclasses

import pytest

import dtype_doctor

from dtype_doctor.run.launchers import split_launcher
from dtype_doctor.run.runner import RunOptions, run_script
from helpers_fsdp import build
from helpers_models import codes
from dtype_doctor.rules import run_rules
from dtype_doctor.rules.dd607_fsdp1_plain_grad_scaler import PLAIN

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    wrapper, scaler_class = sys.argv[1].split("-")
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    if wrapper == "fsdp1":
        model = FullyShardedDataParallel(model, use_orig_params=False, device_id=torch.device("cpu"))
    else:
        from torch.distributed.device_mesh import init_device_mesh
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ShardedGradScaler("cpu") if scaler_class == "ShardedGradScaler" else torch.amp.GradScaler("cpu")
    for _ in range(2):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
""")


@pytest.mark.parametrize("case,named", [("fsdp1-GradScaler", True), ("fsdp1-ShardedGradScaler", False)])
def test_only_fsdp1_with_a_plain_grad_scaler_is_named(tmp_path, case, named):
    (tmp_path / "train.py").write_text(SCRIPT)
    script, launch = split_launcher(["torchrun", "--nproc-per-node", "2", str(tmp_path / "train.py"), case])
    result = run_script(script, options=RunOptions(launch=launch, device="cpu"))
    report = result.report
    assert result.outcome.error is None and report.trace.world.size == 2
    assert report.trace.world.strategy == "fsdp"
    assert report.trace.scaler.endswith(case.split("-")[1])
    assert ("DD607" in codes(report)) == named
    if named:
        [f] = [f for f in report.findings if f.code == "DD607"]
        assert "ShardedGradScaler" in f.fixes[0].description and "2 ranks" in f.message


def test_fsdp2_with_a_plain_grad_scaler_is_not_named():
    """FSDP2's gradients are DTensors: DTensor's dispatch reduces found_inf (the gloo run keeps the ranks' scales equal).
    Traced through the API here, and by `run` of the real torchrun line below."""
    with dtype_doctor.fake_world(2) as mesh:
        model, x = build("correct-policy", mesh)
        trace = dtype_doctor.diagnose(model, {"input": x}, train=True).trace
    assert trace.world.strategy == "fsdp2"
    assert "DD607" not in {f.code for f in run_rules(dataclasses.replace(trace, scaler=sorted(PLAIN)[0]))}
    fsdp1 = dataclasses.replace(trace, scaler=sorted(PLAIN)[0], world=dataclasses.replace(trace.world, strategy="fsdp"))
    assert "DD607" in {f.code for f in run_rules(fsdp1)}


def test_a_real_fsdp2_step_under_run_is_measured_and_not_named(tmp_path):
    """`run` of a real (unsimulated) FSDP2 step on the CPU, as rank 0 of torch's fake process group: the
    step runs to its end and the plain GradScaler is clean, and no value is called measured, since the
    fake group stood in for rank 1's shards (its collectives move no data)."""
    (tmp_path / "train.py").write_text(SCRIPT)
    script, launch = split_launcher(["torchrun", "--nproc-per-node", "2", str(tmp_path / "train.py"), "fsdp2-GradScaler"])
    result = run_script(script, options=RunOptions(launch=launch, device="cpu"))
    report = result.report
    assert result.outcome.error is None and report.trace.world.strategy == "fsdp2"
    assert report.trace.coverage.stopped is None and "DD607" not in codes(report)
    assert not report.trace.values_measured and "fake process group" in report.trace.values
    assert all(op.stats is None for op in report.trace.ops)
