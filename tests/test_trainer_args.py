"""A script's TrainingArguments read as its launch configuration by `run`: the conflicts transformers and
accelerate raise get the launch rules' codes (DD610, DD611, DD612), with the libraries' own errors."""

import textwrap

import pytest
from accelerate.utils import DeepSpeedPlugin

from dtype_doctor.run.runner import RunOptions, run_script
from dtype_doctor.run.trainer_args import BOTH

DS_FP16 = {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}
SCRIPT = textwrap.dedent(f"""
    import sys, torch
    from transformers import TrainingArguments
    kw = {{"both": dict(fp16=True, bf16=True, use_cpu=True), "ds": dict(bf16=True, deepspeed={DS_FP16!r}),
          "ds-file": dict(bf16=True, deepspeed="ds.json"), "bf16": dict(bf16=True), "fp16": dict(fp16=True),
          "ds-cpu": dict(use_cpu=True, deepspeed="ds.json")}}[sys.argv[1]]
    args = TrainingArguments(output_dir="out", report_to=[], **kw)
    model = torch.nn.Linear(4, 2).cuda()
    model(torch.randn(3, 4).cuda()).sum().backward()
""")



@pytest.fixture(autouse=True)
def _no_deepspeed_config_left():
    """TrainingArguments(deepspeed=...) and DeepSpeedPlugin register transformers' process-wide
    DeepSpeed config (a weak reference that a kept traceback holds alive); a later
    from_pretrained in this test process would ask it for ZeRO-3. Each test leaves none behind."""
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()

def traced(tmp_path, monkeypatch, case: str, gpu: str):
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps(DS_FP16))
    return run_script(["python", "train.py", case], options=RunOptions(simulate=True, gpu=gpu))


def launch_codes(report) -> dict[str, object]:
    return {f.code: f for f in report.findings if f.code.startswith("DD61")}


def test_fp16_and_bf16_together_are_refused_by_transformers_and_named_dd611(tmp_path, monkeypatch):
    from transformers import TrainingArguments

    with pytest.raises(ValueError, match=BOTH):  # transformers itself, on this CPU
        TrainingArguments(output_dir=str(tmp_path), report_to=[], fp16=True, bf16=True, use_cpu=True)
    result = traced(tmp_path, monkeypatch, "both", "a100")
    assert isinstance(result.outcome.error, ValueError) and result.steps == 0  # the script stopped there, as it would
    found = launch_codes(result.report)
    assert list(found) == ["DD611"] and found["DD611"].pytorch_error.startswith(f"ValueError: {BOTH}")
    assert result.report.trace.coverage.stopped.startswith("at TrainingArguments(...) at train.py:")


@pytest.mark.parametrize("case", ["ds", "ds-file"])
def test_bf16_against_a_deepspeed_fp16_block_is_accelerates_refusal_dd610(tmp_path, monkeypatch, case):
    with pytest.raises(ValueError, match="cannot be set to `bf16` when `fp16` is set"):  # what Trainer's Accelerator raises
        DeepSpeedPlugin(hf_ds_config=dict(DS_FP16)).set_mixed_precision("bf16")
    result = traced(tmp_path, monkeypatch, case, "a100")
    assert result.outcome.error is None  # DeepSpeed is not installed here: the arguments are validated without it
    launch = result.report.trace.launch
    assert launch.trainer_args and launch.mixed_precision == "bf16" and launch.distributed == "deepspeed" and launch.zero_stage == 2
    assert list(launch_codes(result.report)) == ["DD610"]


def test_bf16_on_a_t4_runs_and_is_dd612_fp16_is_clean(tmp_path, monkeypatch):
    result = traced(tmp_path, monkeypatch, "bf16", "t4")
    assert result.outcome.error is None  # transformers asks torch.cuda.is_bf16_supported(), True on a T4 (emulated)
    assert [f.severity for f in launch_codes(result.report).values()] == ["warning"] and "DD612" in launch_codes(result.report)
    assert not launch_codes(traced(tmp_path, monkeypatch, "fp16", "t4").report)


def test_a_deepspeed_file_that_is_not_there_is_the_scripts_own_failure(tmp_path, monkeypatch):
    from dtype_doctor.records.errors import InputError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.replace('deepspeed="ds.json"', 'deepspeed="missing.json"'))
    with pytest.raises(InputError, match="before calling a model"):  # transformers' error ends the script, not the doctor's
        run_script(["python", "train.py", "ds-file"], options=RunOptions(simulate=True, gpu="a100"))


def test_a_real_run_keeps_the_scripts_deepspeed_argument_and_restores_transformers(tmp_path, monkeypatch):
    """Only a simulated run stands in for the DeepSpeed this machine lacks: a real one fails where the
    script alone fails, and TrainingArguments is transformers' own again afterwards."""
    import importlib.util
    import json
    import subprocess
    import sys

    from transformers import TrainingArguments

    from dtype_doctor.records.errors import InputError

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("DeepSpeed is installed here: the script would get past its TrainingArguments")
    original = TrainingArguments.__post_init__
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ds.json").write_text(json.dumps(DS_FP16))
    alone = subprocess.run([sys.executable, "train.py", "ds-cpu"], capture_output=True, text=True, timeout=300)
    assert alone.returncode != 0 and "deepspeed" in alone.stderr.lower()  # the oracle: the script alone stops there
    with pytest.raises(InputError, match="before calling a model") as stopped:
        run_script(["python", "train.py", "ds-cpu"], options=RunOptions())
    assert "deepspeed" in str(stopped.value).lower() and "cuda" not in str(stopped.value).lower()  # at its TrainingArguments
    assert TrainingArguments.__post_init__ is original
