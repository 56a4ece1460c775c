"""DD505: a bitsandbytes model whose device map offloads to cpu/disk without
llm_int8_enable_fp32_cpu_offload. transformers 5 refuses it while loading (a ValueError from its
bitsandbytes quantizer's validate_environment, 8-bit and 4-bit alike, on this CPU machine too:
the check reads the map, not the devices); with the flag it loads, the offloaded modules float32."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")

import torch  # noqa: E402
from helpers_models import FIXTURE_MODELS  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from dtype_doctor.records.errors import UsageError  # noqa: E402
from dtype_doctor.load.offload import refusal_of, refused_trace  # noqa: E402
from dtype_doctor.records import QuantizationInfo  # noqa: E402
from dtype_doctor.rules import run_rules  # noqa: E402

LLAMA = FIXTURE_MODELS / "llama-tiny"
DATA = FIXTURE_MODELS.parent / "data" / "lm-text"
SCRIPTS = Path(__file__).parent / "scripts"
GPU_AND_CPU = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0,
               "model.layers.1": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
CPU_AND_DISK = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"}


def load(device_map: dict, **config: bool):
    return AutoModelForCausalLM.from_pretrained(LLAMA, quantization_config=BitsAndBytesConfig(**config), device_map=device_map,
                                                offload_folder=tempfile.mkdtemp())


@pytest.mark.parametrize("bits", ["load_in_8bit", "load_in_4bit"])
def test_transformers_refuses_an_offloading_map_and_the_rule_names_its_modules(bits: str) -> None:
    with pytest.raises(ValueError) as exc:
        load(GPU_AND_CPU, **{bits: True})
    refusal = refusal_of(exc.value)
    assert refusal is not None and not refusal.quantization.fp32_cpu_offload
    trace = refused_trace(refusal)
    findings = run_rules(trace)
    assert [f.code for f in findings] == ["DD505"]  # not DD001: DD505 explains the failed load
    f = findings[0]
    assert f.stage == "model-loading" and f.module == "model.layers.1"
    assert "model.layers.1, model.norm and lm_head" in f.message and "cuda:0" in f.message
    assert [(r.strategy, r.to) for r in f.remedies] == [("bnb-fp32-cpu-offload", "True")]


@pytest.mark.parametrize("bits", ["load_in_8bit", "load_in_4bit"])
def test_with_the_flag_the_same_kind_of_map_loads_and_keeps_the_offloaded_modules_float32(bits: str) -> None:
    with pytest.raises(ValueError):
        load(CPU_AND_DISK, **{bits: True})  # cpu beside disk: refused as cpu beside a GPU is
    model = load(CPU_AND_DISK, **{bits: True}, llm_int8_enable_fp32_cpu_offload=True)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert type(q_proj) is torch.nn.Linear and q_proj.weight.dtype == torch.float32
    all_cpu = load({"": "cpu"}, **{bits: True})  # an all-cpu map is not offloading: quantized, accepted
    assert type(all_cpu.model.layers[0].self_attn.q_proj).__name__ in ("Linear8bitLt", "Linear4bit")


# Device maps as users write them (GPU indices, "cuda:k", "cpu", "disk"), each asked of
# transformers' own bitsandbytes quantizer and of the rule.
MAPS = [{"a": 0, "b": "cpu"}, {"a": "cpu", "b": "disk"}, {"a": "cpu", "b": "cpu"}, {"a": 0, "b": 1}, {"": "cpu"},
        {"": "disk"}, {"a": "cuda:0", "b": "cuda:1", "c": "disk"}, {"a": 0, "b": "cuda:1"}]


@pytest.mark.parametrize("bits", ["load_in_8bit", "load_in_4bit"])
@pytest.mark.parametrize("flag", [False, True])
def test_the_rule_agrees_with_transformers_own_check(bits: str, flag: bool) -> None:
    # The oracle is the check from_pretrained runs (the quantizer's validate_environment), not a
    # copy of its condition: DD505 is reported exactly where transformers refuses the map.
    from transformers.quantizers import AutoHfQuantizer

    from dtype_doctor.load.offload import LoadRefusal, info_of

    config = BitsAndBytesConfig(**{bits: True}, llm_int8_enable_fp32_cpu_offload=flag)
    method = "bitsandbytes-8bit" if bits == "load_in_8bit" else "bitsandbytes-4bit"
    refused_maps = 0
    for device_map in MAPS:
        try:
            AutoHfQuantizer.from_config(config).validate_environment(device_map=device_map)
            refused = False
        except ValueError:
            refused = True
        refused_maps += refused
        codes = [f.code for f in run_rules(refused_trace(LoadRefusal(info_of(config, method, device_map), "refused")))]
        assert ("DD505" in codes) == refused, (bits, flag, device_map, codes)
    assert refused_maps == (0 if flag else 4)  # the grid holds both answers


def test_scan_simulated_plans_the_map_with_the_quantized_sizes() -> None:
    """--simulate --gpu t4 --device-map auto: transformers' own placement (int8 sizes, its 10%
    margin) over the simulated GPU's memory. 185 KB holds the embedding, not the blocks."""
    from dtype_doctor.pipeline import ScanOptions, scan

    options = ScanOptions(load_in_8bit=True, simulate=True, gpu="t4", device_map="auto", max_memory="0=185KB")
    report = scan(str(LLAMA), str(DATA), options)
    (f,) = [f for f in report.findings if f.code == "DD505"]
    assert "model.layers" in f.message and report.target.quantization.method == "bitsandbytes-8bit"
    assert report.trace is not None and report.trace.failure.phase == "load"
    # the script's own from_pretrained(device_map="auto", max_memory=...) under run --simulate: the same map
    from dtype_doctor.run.runner import RunOptions, run_script

    script = run_script(["python", str(SCRIPTS / "int8_auto_offload.py"), str(LLAMA)], options=RunOptions(simulate=True, gpu="t4"))
    assert dict(script.report.target.quantization.device_map) == dict(report.target.quantization.device_map)
    assert [f.code for f in script.report.findings] == ["DD505"]
    fits = ScanOptions(load_in_8bit=True, simulate=True, gpu="t4", device_map="auto", max_memory="0=1GB")
    with pytest.raises(UsageError, match="traced with real weights"):
        scan(str(LLAMA), str(DATA), fits)  # nothing offloaded: the quantized model is not simulated


def test_run_names_the_scripts_map_and_fix_run_writes_the_flag(capsys, tmp_path, monkeypatch) -> None:
    from dtype_doctor.cli.main import run

    def cli(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            run(list(argv))
        return exc.value.code, capsys.readouterr().out

    code, out = cli("run", "-f", "json", "--", "python", str(SCRIPTS / "int8_gpu_offload.py"), str(LLAMA))
    report = json.loads(out)
    assert code == 1 and [f["code"] for f in report["findings"]] == ["DD505"]
    assert report["findings"][0]["source"]["line"] == 12  # the from_pretrained line
    script = SCRIPTS / "int8_offload.py"
    shutil.copy(script, tmp_path / script.name)
    monkeypatch.chdir(tmp_path)
    code, out = cli("fix", "--run", "--write-patch", "fix.patch", "-f", "json", "--", "python", script.name, str(LLAMA))
    fix = json.loads(out)["fix"]
    assert code == 0 and fix["verified"] is True, fix
    assert "+config = BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True)\n" in (tmp_path / "fix.patch").read_text()


def test_fix_model_data_of_a_refused_load_points_to_fix_run() -> None:
    from dtype_doctor.pipeline import ScanOptions, fix

    options = ScanOptions(load_in_8bit=True, simulate=True, gpu="h100", device_map="auto", max_memory="0=185KB")
    report = fix(str(LLAMA), str(DATA), options)
    assert "DD505" in {f.code for f in report.findings}
    assert report.fix is not None and report.fix.verified is False
    assert [(s.strategy, s.status) for s in report.fix.steps] == [("bnb-fp32-cpu-offload", "skipped")]
    assert "fix --run" in report.fix.detail


def test_the_refused_load_fix_asks_the_strategy_the_same_questions_as_the_in_memory_fix(monkeypatch) -> None:
    # run's fix of a refused load plans from the report alone, through the strategy as any finding
    # of a script is planned: a strategy that changes weight precision needs --unsafe-fixes there too.
    from pathlib import Path

    from dtype_doctor.fix.strategies import STRATEGIES, Site
    from dtype_doctor.fix.strategies.base import UNSAFE
    from dtype_doctor.run.fix import plan_fixes
    from dtype_doctor.run.command import ScriptCommand
    from dtype_doctor.run.runner import RunOptions, refused_load

    with pytest.raises(ValueError) as exc:
        load(GPU_AND_CPU, load_in_8bit=True)
    report = refused_load(exc.value, ScriptCommand("file", "train.py", ()), RunOptions())
    assert report is not None and [f.code for f in report.findings] == ["DD505"]
    site = Site(script=Path("train.py"), run=True)
    (plan,) = plan_fixes(report, site, fail_on="warning")
    assert [c.strategy for c in plan.candidates] == ["bnb-fp32-cpu-offload"] and not plan.skipped
    monkeypatch.setattr(type(STRATEGIES["bnb-fp32-cpu-offload"]), "applicability", UNSAFE)
    (plan,) = plan_fixes(report, site, fail_on="warning")
    (step,) = plan.skipped
    assert not plan.candidates and step.status == "skipped" and "--unsafe-fixes" in step.detail
    (plan,) = plan_fixes(report, site, fail_on="warning", unsafe_fixes=True)
    assert [c.strategy for c in plan.candidates] == ["bnb-fp32-cpu-offload"]
