"""FSDP2 traced on torch's fake process group (one process) against a real 2-rank gloo run on
the CPU: the doctor's verdicts agree with what the real run does, scenario by scenario."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

import dtype_doctor
from helpers_fsdp import SCALERS, SCENARIOS, build, scales_after_an_overflow, step
from helpers_models import codes


class _Reductions(TorchDispatchMode):
    """The dtypes the real run's reduce-scatters get, and the weight dtypes its layer norms compute with."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[str] = []
        self.norms: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "reduce_scatter" in str(func):
            self.dtypes.append(str(args[0].dtype).removeprefix("torch."))
        if "native_layer_norm.default" in str(func) and args[2] is not None:
            self.norms.append(str(args[2].dtype).removeprefix("torch."))
        return func(*args, **(kwargs or {}))


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for scenario in SCENARIOS:
        model, x = build(scenario, mesh)
        spy = _Reductions()
        try:
            with spy:
                result = step(model, x)
            results[scenario] = {"raised": None, "reduce": sorted(set(spy.dtypes)), "norms": sorted(set(spy.norms)),
                                 "out": str(result.dtype).removeprefix("torch."), "value": result.float().sum().item()}
        except Exception as exc:  # noqa: BLE001 - the outcome is the oracle's answer
            results[scenario] = {"raised": type(exc).__name__, "message": str(exc).splitlines()[0], "reduce": sorted(set(spy.dtypes))}
        dist.barrier()
    results["scales"] = {case: scales_after_an_overflow(case, mesh) for case in SCALERS}
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(results, fh)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo(tmp_path_factory) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path_factory.mktemp("gloo") / "results.json")
    mp.spawn(_worker, args=(2, port, out), nprocs=2, join=True)
    with open(out) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def doctor() -> dict:
    reports = {}
    with dtype_doctor.fake_world(2) as mesh:
        for scenario in SCENARIOS:
            model, x = build(scenario, mesh)
            reports[scenario] = dtype_doctor.diagnose(model, {"input": x}, train=True)
    return reports


def test_a_correct_policy_runs_and_is_clean(gloo, doctor):
    real, report = gloo["correct-policy"], doctor["correct-policy"]
    assert real["raised"] is None and real["reduce"] == ["float32"]
    assert not [f for f in report.findings if f.severity == "error"] and "DD603" not in codes(report)
    traced = {op.operands[0].dtype for op in report.trace.ops if "reduce_scatter" in op.op}
    assert traced == set(real["reduce"])  # the reduce-scatter got the dtype the gloo run's got
    assert report.target.world.size == 2 and report.target.world.strategy == "fsdp2"


def test_mixed_trainable_dtypes_in_one_unit(gloo, doctor):
    real, report = gloo["mixed-trainable-dtypes"], doctor["mixed-trainable-dtypes"]
    assert real["raised"] == "AssertionError" and "FSDP expects uniform original parameter dtype" in real["message"]
    [f] = [f for f in report.findings if f.code == "DD601"]
    assert f.severity == "error" and f.module == "0"
    assert f.pytorch_error.split(" but got")[0] == real["message"].split(" but got")[0]  # a set: its order varies
    assert {t.dtype for t in f.tensors} == {"bfloat16", "float32"}


def test_uncast_inputs(gloo, doctor):
    real, report = gloo["uncast-inputs"], doctor["uncast-inputs"]
    assert real["raised"] == "RuntimeError"
    [f] = [f for f in report.findings if f.code == "DD602"]
    assert f.module == "" and f.remedies[0].strategy == "cast-inputs" and f.remedies[0].to == "bfloat16"


def test_reduce_dtype_unset_reduces_in_bf16(gloo, doctor):
    real, report = gloo["bf16-reduce"], doctor["bf16-reduce"]
    assert real["raised"] is None and real["reduce"] == ["bfloat16"]
    [f] = [f for f in report.findings if f.code == "DD603"]
    assert f.severity == "warning" and f.tensors[0].dtype == "bfloat16"


def test_bf16_logits_into_the_loss_run_and_the_loss_is_bf16(gloo, doctor):
    real, fixed = gloo["bf16-loss"], gloo["fp32-output-loss"]
    assert real["raised"] is None and real["out"] == "bfloat16"  # nothing raises: the loss itself is bf16
    assert fixed["raised"] is None and fixed["out"] == "float32"
    assert real["value"] != fixed["value"]  # the same weights and batch: bf16's rounding is in the loss
    [f] = [f for f in doctor["bf16-loss"].findings if f.code == "DD605"]
    assert f.severity == "warning" and f.tensors[0].dtype == "bfloat16" and "output_dtype=torch.float32" in f.fixes[0].description
    assert "DD605" not in codes(doctor["fp32-output-loss"])


@pytest.mark.parametrize("scenario", ["keep-fp32-frozen", "keep-fp32-declared"])
def test_a_norm_kept_in_fp32_computes_in_the_units_param_dtype(gloo, doctor, scenario):
    real = gloo[scenario]
    assert real["raised"] is None and real["norms"] == ["bfloat16"]  # FSDP gathered the fp32 norm in bf16, silently
    [f] = [f for f in doctor[scenario].findings if f.code == "DD606"]
    assert f.module == "norm" and {t.dtype for t in f.tensors} == {"float32"}


def test_the_norm_as_its_own_fp32_unit_keeps_fp32(gloo, doctor):
    real = gloo["keep-fp32-own-unit"]
    assert real["raised"] is None and real["norms"] == ["float32"]
    assert not {"DD606", "DD601"} & codes(doctor["keep-fp32-own-unit"])


def test_a_plain_grad_scaler_lets_fsdp1_ranks_disagree_fsdp2_does_not(gloo):
    """The oracle for DD607 (tests/test_rules_dd607.py traces the same loops): an overflow in rank 1's shard only."""
    scales = gloo["scales"]
    assert scales["fsdp1-GradScaler"] == [65536.0, 32768.0]  # rank 0 stepped, rank 1 skipped and backed off
    assert scales["fsdp1-ShardedGradScaler"] == [32768.0, 32768.0]  # found_inf all-reduced: both skip
    assert scales["fsdp2-GradScaler"] == [32768.0, 32768.0]  # DTensor gradients: found_inf reduced by DTensor's dispatch
