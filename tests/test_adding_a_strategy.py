"""Adding a fix strategy is its module (plus its test and the codemod its edits use): a new
module dropped into dtype_doctor/fix/strategies/ of a copy of the package, and no other file
touched, takes part in the `--strategy` help, auto's order, the report's words and JSON kind,
a rule's fix text and the generated fix module, which runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A strategy no one wrote before: make the model's outputs float32 (a forward hook).
NEW_STRATEGY = '''
"""float-outputs: the model's floating outputs in float32 (a forward hook): a strategy written for a test."""

from __future__ import annotations

from typing import Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, ModulePart, Strategy, listed


class FloatOutputs(
    Strategy, name="float-outputs", applicability=SAFE, rank=35, json_kind="float-output",
    summary="return the model's floating outputs in float32",
):
    def suggestion(self, remedies: Sequence) -> str:
        return f"return {listed([r.target for r in remedies])} in float32"

    def describe(self, c: Change) -> str:
        return f"return {c.target} in float32"

    def plan(self, pipeline, report, ctx):
        return tuple(Change(self.name, r.target, "float32") for r in self.remedies(report, ctx))

    def apply(self, pipeline, changes):
        return pipeline

    fix_module = ModulePart(
        function="float_outputs",
        role="model",
        order=28,
        why="The model's floating outputs are returned in float32.",
        usage="model = apply_fix(model, batch)\\noutputs = model(**batch)",
        source="""

def float_outputs(model, batch):
    # Make `model` return its floating outputs in {dtype}; return it.
    def hook(module, args, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(torch.{dtype})
        return tuple(o.to(torch.{dtype}) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in output)
    model.register_forward_hook(hook)
    return model
""",
    )

    def module_fields(self, params):
        return {"dtype": "float32"}
'''

CHECK = '''
import subprocess, sys

from dtype_doctor.fix import strategies
from dtype_doctor.fix.codemods import NewFixModule
from dtype_doctor.fix.outcome import Change
from dtype_doctor.records import Remedy
from dtype_doctor.rules.base import Rule

# the --strategy help, the names --strategy takes, and auto's order (by rank)
assert "float-outputs: return the model's floating outputs in float32" in strategies.help_text()
assert "float-outputs" in strategies.NAMES
assert strategies.AUTO_ORDER.index("float-outputs") == strategies.AUTO_ORDER.index("autocast") + 1
help_ = subprocess.run([sys.executable, "-m", "dtype_doctor", "fix", "--help"], capture_output=True, text=True, check=True).stdout
assert "float-outputs:returnthemodel'sfloatingoutputsinfloat32" in "".join(help_.split()), help_  # wrapped at any width

# the report's words and JSON kind
change = Change("float-outputs", "logits", "float32", "float16")
assert strategies.describe(change) == "return logits in float32"
assert change.to_dict()["kind"] == "float-output" and change.to_dict()["strategy"] == "float-outputs"

# a rule that names it states a Remedy; the finding's words come from the new strategy
rule = Rule("DD999", "example", "warning", "s", "w", "e", "f", "fs")
[finding] = strategies.worded([rule.finding("half logits", remedies=[Remedy("float-outputs", "logits", "float32")])])
assert [(x.strategy, x.applicability, x.description) for x in finding.fixes] == [("float-outputs", "safe", "return logits in float32")]

# its part of the generated fix module, between the model's conversions and the batch's
result = NewFixModule(parts=[("cast-inputs", {"casts": {"x": "float16"}}), ("float-outputs", {}), ("half-model", {})]).apply("", "dtype_doctor_fix.py")
assert result.applied, result
assert "half_model(), float_outputs(), cast_inputs()" in result.detail, result.detail
ns = {}
exec(compile(result.new_source, "dtype_doctor_fix.py", "exec"), ns)
assert "The model's floating outputs are returned in float32." in ns["__doc__"]
import torch

model = torch.nn.Linear(4, 2)
batch = ns["apply_fix"](model, {"x": torch.randn(3, 4)})
assert model.weight.dtype == torch.float16 and batch["x"].dtype == torch.float16
out = model(batch["x"])
assert out.dtype == torch.float32, out.dtype
alone = NewFixModule("float-outputs").apply("", "dtype_doctor_fix.py")
assert "    return float_outputs(model, batch)\\n" in alone.new_source
print("ok")
'''


def test_a_new_strategy_module_takes_part_everywhere_without_touching_another_file(tmp_path: Path) -> None:
    copy = tmp_path / "dtype_doctor"
    shutil.copytree(ROOT / "dtype_doctor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    (copy / "fix" / "strategies" / "float_outputs.py").write_text(textwrap.dedent(NEW_STRATEGY), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    after = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert {k: v for k, v in after.items() if k.name != "float_outputs.py"} == before  # no other file changed


def test_without_the_new_module_the_package_knows_no_such_strategy() -> None:
    from dtype_doctor.fix.codemods import NewFixModule
    from dtype_doctor.fix.strategies import NAMES

    assert "float-outputs" not in NAMES
    assert NewFixModule("float-outputs").apply("", "dtype_doctor_fix.py").detail.startswith("no fix module for strategy 'float-outputs'")
