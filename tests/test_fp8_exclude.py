"""fp8-exclude: DD506's layers with a dimension CUDA refuses, left out of fp8 conversion — in memory
(the fp8 layer swapped back for a plain nn.Linear) and in the user's code (the conversion call's
module_filter_fn, ExcludeFromConversion), verified by re-running under --simulate --gpu h100."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dtype_doctor.fix.codemods import ExcludeFromConversion

SCRIPTS = Path(__file__).parent / "scripts"
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def test_the_codemod_adds_merges_and_wraps_a_filter() -> None:
    torchao = "convert_to_float8_training(model)\n"
    added = ExcludeFromConversion(["layers.1.mlp", "head"]).apply(torchao, "t.py")
    assert added.new_source == 'convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn not in {"head", "layers.1.mlp"})\n'
    merged = ExcludeFromConversion(["x"]).apply(added.new_source, "t.py")
    assert 'fqn not in {"head", "layers.1.mlp", "x"})' in merged.new_source  # its own filter: one set, no nesting
    own = "swap(model, module_filter_fn=keep)\n"
    wrapped = ExcludeFromConversion(["a"]).apply(own, "t.py").new_source
    assert wrapped == 'swap(model, module_filter_fn=lambda mod, fqn: fqn not in {"a"} and (keep)(mod, fqn))\n'
    again = ExcludeFromConversion(["b"]).apply(wrapped, "t.py").new_source
    assert again == 'swap(model, module_filter_fn=lambda mod, fqn: fqn not in {"a", "b"} and (keep)(mod, fqn))\n'
    assert ExcludeFromConversion(["a"]).apply("convert(model)\n", "t.py").status == "skipped"  # no conversion call
    two = torchao + "convert_to_float8_training(other)\n"
    assert ExcludeFromConversion(["a"]).apply(two, "t.py").status == "skipped"  # which one is not known


def test_the_written_filter_is_what_a_conversion_calls() -> None:
    """The edited call, run: module_filter_fn(module, fqn) as torchao calls it."""
    seen: dict[str, bool] = {}

    def swap(model: nn.Module, module_filter_fn=None) -> None:  # noqa: ANN001
        for fqn, mod in model.named_modules():
            if isinstance(mod, nn.Linear):
                seen[fqn] = module_filter_fn(mod, fqn)

    source = ExcludeFromConversion(["2"]).apply("swap(model, module_filter_fn=lambda m, n: m.in_features > 8)\n", "t.py").new_source
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 40), nn.Linear(40, 4), nn.Linear(4, 4))
    exec(compile(source, "t.py", "exec"), {"swap": swap, "model": model})  # noqa: S102 - our own text
    assert seen == {"0": True, "2": False, "3": True, "4": False}


def _fp8_model() -> nn.Module:
    source = (SCRIPTS / "fp8_train.py").read_text().split("torch.manual_seed(0)")[0]  # the classes, not the loop
    scope: dict = {"__name__": "fp8_layers"}
    exec(compile(source, str(SCRIPTS / "fp8_train.py"), "exec"), scope)  # noqa: S102 - our own fixture
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 16))
    return scope["swap_to_float8"](model)


def test_dd506_names_the_layers_and_the_fix_swaps_them_back_verified() -> None:
    from dtype_doctor.fix.engine import fix_model

    model, x = _fp8_model(), torch.randn(16, 32)
    assert model(x).shape == (16, 16)  # the CPU runs every fp8 matmul
    request = dict(device="cuda", simulate=True, gpu="h100")  # decide()'s keywords, as diagnose takes them
    import dtype_doctor

    report = dtype_doctor.diagnose(model, {"input": x}, **request)
    found = [f for f in report.findings if f.code == "DD506"]
    assert {r.target for f in found for r in f.remedies} == {"2", "4"}  # N=40, then K=40
    assert {(r.strategy, r.to) for f in found for r in f.remedies} == {("fp8-exclude", "float32")}
    assert "DD001" not in {f.code for f in report.findings}
    # The fp8 layers' own quantizing casts of their input (float32 → float8_e4m3fn) are by design, not the pipeline's.
    assert any(op.op == "aten._to_copy.default" and op.outputs and op.outputs[0].dtype == "float8_e4m3fn" for op in report.trace.ops)
    assert "DD108" not in {f.code for f in report.findings}
    from dtype_doctor.machine import decide
    from dtype_doctor.trace.request import TraceRequest

    result = fix_model(model, {"input": x}, TraceRequest(placement=decide(**request)), measure=False)
    assert result.verified and "DD506" not in {f.code for f in result.after.findings}
    assert type(model[2]).__name__ == "Float8Linear"  # the user's model is not touched


def test_fix_run_writes_the_filter_into_the_script_and_the_rerun_is_clean(capsys, tmp_path, monkeypatch) -> None:
    from dtype_doctor.cli.main import run

    script = SCRIPTS / "fp8_train.py"
    shutil.copy(script, tmp_path / script.name)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run(["fix", "--run", "--simulate", "--gpu", "h100", "--write-patch", "fp8.patch", "-f", "json", "--", "python", script.name])
    report = json.loads(capsys.readouterr().out)
    fix = report["fix"]
    assert exc.value.code == 0 and fix["verified"] is True, fix
    assert "DD506" not in {f["code"] for f in fix["after"]["findings"]}
    patch = (tmp_path / "fp8.patch").read_text()
    assert '+swap_to_float8(model, module_filter_fn=lambda mod, fqn: fqn not in {"2", "4"} and (lambda mod, fqn: mod.in_features >= 16)(mod, fqn))' in patch


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed (pip install 'dtype-doctor[quant]')")
def test_the_edit_leaves_the_layers_out_of_torchaos_conversion(tmp_path: Path) -> None:
    """In a subprocess (torchao prints to stderr on a CPU build): the edited convert_to_float8_training call."""
    source = (
        "import torch.nn as nn\nfrom torchao.float8 import convert_to_float8_training\n"
        "model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 40), nn.ReLU(), nn.Linear(40, 16))\n"
        "convert_to_float8_training(model)\n"
        "print([type(m).__name__ for m in model])\n"
    )
    edited = ExcludeFromConversion(["2", "4"]).apply(source, "t.py").new_source
    (tmp_path / "t.py").write_text(edited)
    done = subprocess.run([sys.executable, str(tmp_path / "t.py")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "['Float8Linear', 'ReLU', 'Linear', 'ReLU', 'Linear']"


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed (pip install 'dtype-doctor[quant]')")
def test_a_torchao_script_is_fixed_and_the_patched_script_reruns_clean(capsys, tmp_path, monkeypatch) -> None:
    """convert_to_float8_training on the 32→48→40→16 MLP, trained: torchao's own _scaled_mm calls
    are judged, its Float8Linear swapped back in memory (a train step re-traced clean) and the
    conversion call given a module_filter_fn, re-run under the same simulation."""
    from dtype_doctor.cli.main import run

    script = SCRIPTS / "fp8_torchao_train.py"
    shutil.copy(script, tmp_path / script.name)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run(["fix", "--run", "--simulate", "--gpu", "h100", "--write-patch", "fp8.patch", "-f", "json", "--", "python", script.name])
    out = capsys.readouterr()
    report, fix = json.loads(out.out), json.loads(out.out)["fix"]
    assert exc.value.code == 0 and fix["verified"] is True, fix
    assert {r["target"] for f in report["findings"] if f["code"] == "DD506" for r in f["remedies"]} == {"2"}  # the step stops there
    assert "DD506" not in {f["code"] for f in fix["after"]["findings"]}
    assert all(line.startswith("dtype-doctor: [") for line in out.err.splitlines()), out.err  # torchao's import-time log lines held back: our progress only
    patch = (tmp_path / "fp8.patch").read_text()
    assert '+convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn not in {"2", "4"})' in patch
