"""A tiny Llama quantized to 4 and 8 bits by real bitsandbytes on the CPU: what the report says it is
(`target.quantization`, adapters included), the CLI's --load-in-4bit/--load-in-8bit, and a QLoRA
script fixed by `fix --run`."""

import json

import pytest

pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")
peft = pytest.importorskip("peft", reason="peft is not installed (pip install 'dtype-doctor[quant]')")

from helpers_models import FIXTURE_MODELS, llama_4bit, lm_batch  # noqa: E402

import dtype_doctor  # noqa: E402

LLAMA = FIXTURE_MODELS / "llama-tiny"
DATA = FIXTURE_MODELS.parent / "data" / "lm-text"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI in-process, as the console script runs it: (exit code, stdout, stderr)."""
    from dtype_doctor.cli.main import run

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_without_the_upcast_nothing_is_reported_and_adapters_are_listed() -> None:
    model = llama_4bit()
    peft_model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    report = dtype_doctor.diagnose(peft_model, lm_batch())
    assert not {"DD501", "DD503"} & {f.code for f in report.findings}
    q = report.target.quantization
    assert (q.method, q.quant_type, q.compute_dtype, q.layers) == ("bitsandbytes-4bit", "nf4", "float16", 14)
    assert {(a.kind, a.dtype, a.count) for a in q.adapters} == {("lora_A", "float32", 4), ("lora_B", "float32", 4)}
    d = report.to_dict()["target"]["quantization"]
    assert d["adapters"][0]["dtype"] == "float32" and d["storage_dtype"] == "uint8"


@pytest.mark.parametrize("flags,method,quant", [
    (["--load-in-4bit", "--bnb-quant-type", "fp4", "--dtype", "float16"], "bitsandbytes-4bit", "fp4"),
    (["--load-in-8bit"], "bitsandbytes-8bit", "int8"),
])
def test_cli_loads_quantized(capsys, flags, method, quant) -> None:
    code, out, err = cli(capsys, "scan", str(LLAMA), str(DATA), *flags, "--format", "json", "--fail-on", "never")
    assert code == 0, err
    target = json.loads(out)["target"]
    assert (target["quantization"]["method"], target["quantization"]["quant_type"]) == (method, quant)
    codes = {f["code"] for f in json.loads(out)["findings"]}
    assert ("DD501" in codes) == (method == "bitsandbytes-4bit")  # fp16 model, default float32 compute dtype


def test_cli_refuses_bad_quantization_flags(capsys) -> None:
    for flags in (["--load-in-4bit", "--load-in-8bit"], ["--bnb-compute-dtype", "float16"], ["--load-in-4bit", "--simulate"],
                  ["--load-in-4bit", "--bnb-quant-type", "int3"]):
        code, out, err = cli(capsys, "scan", str(LLAMA), str(DATA), *flags)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (flags, err)


def test_fix_run_writes_the_compute_dtype_into_the_qlora_script(capsys, tmp_path, monkeypatch) -> None:
    """tests/scripts/qlora_train.py: a float16 4-bit base with the default BitsAndBytesConfig and LoRA
    adapters. `fix --run` finds DD501 in the script's own step, fixes it, re-runs the patched script
    to verify, and writes the keyword into the script's BitsAndBytesConfig(...) call."""
    import shutil
    from pathlib import Path

    script = Path(__file__).parent / "scripts" / "qlora_train.py"
    shutil.copy(script, tmp_path / script.name)
    monkeypatch.chdir(tmp_path)
    # The script never calls model.train() and its frozen base sees inputs without grad: on a CPU with
    # avx512_bf16 bitsandbytes packs the weights for its fused kernel, which fails for llama-tiny's
    # hidden size (32, below the block of 64) in the plain run too (tests/test_bnb_cpu_paths.py shows
    # both paths). This test is about the fix, so it takes the path every CPU has.
    import bitsandbytes

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: False)
    # --select DD5: the quantization rules this fix is for (DD302 measures the fp16 step's gradients, see test_run_realistic)
    code, out, err = cli(capsys, "fix", "--run", "--select", "DD5", "--fail-on", "warning", "--write-patch", "fix.patch", "-f", "json",
                         "--", "python", script.name, str(LLAMA))
    assert code == 0, err
    report = json.loads(out)
    assert "DD501" in {f["code"] for f in report["findings"]}
    assert report["target"]["quantization"]["adapters"]
    fix = report["fix"]
    assert fix["verified"] is True and fix["patch"]["files"] == [script.name], fix
    patch = (tmp_path / "fix.patch").read_text()
    assert "+    bnb_4bit_compute_dtype=torch.float16,\n" in patch
    assert (tmp_path / script.name).read_text() == script.read_text()  # the patch, not the file
