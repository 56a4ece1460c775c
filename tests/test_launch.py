"""Launcher command lines and launch configurations: `run -- accelerate launch ...` and `-- torchrun ...`
traced as rank 0 of N on the fake process group; the precision conflicts accelerate and DeepSpeed
raise at launch (DD610, DD611) and precisions the --gpu profile cannot run (DD612)."""

import json
import textwrap

import pytest
from accelerate.utils import DeepSpeedPlugin

from dtype_doctor.run.launchers import DEEPSPEED_BOTH, split_launcher
from dtype_doctor.run.runner import RunOptions, run_script

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    dist.init_process_group("nccl")
    print("world", dist.get_world_size(), "rank", dist.get_rank(), file=sys.stderr)
    open(sys.argv[1], "w").write(f"{dist.get_world_size()} {dist.get_rank()}")
    model = torch.nn.Linear(4, 2).cuda()
    model(torch.randn(3, 4).cuda()).sum().backward()
""")


def files(tmp_path, mixed: str, ds: dict) -> tuple[str, str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "cfg.yaml").write_text(textwrap.dedent(f"""
        compute_environment: LOCAL_MACHINE
        distributed_type: DEEPSPEED
        deepspeed_config:
          deepspeed_config_file: {tmp_path / 'ds.json'}
          zero3_init_flag: false
        mixed_precision: {mixed}
        num_processes: 8
    """))
    return str(tmp_path / "cfg.yaml"), str(tmp_path / "train.py")


def run(words, tmp_path, gpu=None):
    script, launch = split_launcher(words, 8)
    result = run_script(script, options=RunOptions(simulate=True, gpus=8, gpu=gpu, launch=launch, keep_writes=str(tmp_path / "kept")))
    return launch, result.report


def written(tmp_path, out):
    """What the simulated script wrote to `out`: held back from the file system, kept under kept/."""
    assert not out.exists()
    return (tmp_path / "kept" / str(out).lstrip("/")).read_text()


def test_accelerate_refuses_bf16_against_a_deepspeed_fp16_block(tmp_path):
    ds = {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    with pytest.raises(ValueError, match="`--mixed_precision` arg cannot be set to `bf16` when `fp16` is set in the DeepSpeed config file"):
        DeepSpeedPlugin(hf_ds_config=dict(ds)).set_mixed_precision("bf16")  # accelerate itself
    cfg, train = files(tmp_path, "bf16", ds)
    out = tmp_path / "rank.txt"
    launch, report = run(["accelerate", "launch", "--config_file", cfg, train, str(out)], tmp_path)
    assert launch.zero_stage == 2 and launch.offload == ("optimizer:cpu",) and launch.ds_fp16 == "true"
    [f] = [f for f in report.findings if f.code == "DD610"]
    assert "cannot be set to `bf16` when `fp16`" in f.pytorch_error and f.stage == "launch"
    assert written(tmp_path, out) == "8 0"  # the script ran as rank 0 of 8 on the fake process group
    world = report.to_dict()["target"]["world"]
    assert {k: world[k] for k in ("size", "rank", "backend", "launcher")} == {"size": 8, "rank": 0, "backend": "fake", "launcher": "accelerate"}
    assert world["config"]["mixed_precision"] == "bf16" and world["config"]["zero_stage"] == 2


def test_matching_precisions_launch_clean(tmp_path):
    cfg, train = files(tmp_path, "bf16", {"bf16": {"enabled": "auto"}, "fp16": {"enabled": False}, "zero_optimization": {"stage": 3}})
    _, report = run(["accelerate", "launch", "--config_file", cfg, train, str(tmp_path / "r.txt")], tmp_path)
    assert not {"DD610", "DD611", "DD612"} & {f.code for f in report.findings}


def test_deepspeed_refuses_fp16_and_bf16_together(tmp_path):
    cfg, train = files(tmp_path, "no", {"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    _, report = run(["accelerate", "launch", "--config_file", cfg, train, str(tmp_path / "r.txt")], tmp_path)
    [f] = [f for f in report.findings if f.code == "DD611"]
    assert f.pytorch_error == f"AssertionError: {DEEPSPEED_BOTH}"


def test_torchrun_line_is_rank_0_of_its_world_and_bf16_on_a_t4_is_named(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "rank.txt"
    launch, report = run(["torchrun", "--nproc-per-node", "4", str(tmp_path / "train.py"), str(out)], tmp_path)
    assert launch.processes == 4 and written(tmp_path, out) == "4 0"
    assert report.target.world.launcher == "torchrun" and report.target.world.size == 4
    cfg, train = files(tmp_path, "bf16", {"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 1}})
    _, report = run(["accelerate", "launch", "--config_file", cfg, train, str(out)], tmp_path, gpu="t4")
    assert [f.severity for f in report.findings if f.code == "DD612"] == ["warning"]


def test_the_command_line_takes_a_torchrun_line(tmp_path, monkeypatch, capsys):
    from dtype_doctor.cli.main import run as cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    with pytest.raises(SystemExit) as code:
        cli(["run", "--simulate", "--gpus", "8", "--keep-writes", "kept", "-f", "json", "--", "torchrun", "--nproc-per-node", "8", "train.py", "rank.txt"])
    report = json.loads(capsys.readouterr().out)
    assert code.value.code == 0 and (tmp_path / "kept" / "rank.txt").read_text() == "8 0"
    assert [w["path"] for w in report["writes"]] == ["rank.txt"]
    assert report["target"]["world"]["size"] == 8 and report["target"]["world"]["launcher"] == "torchrun"
