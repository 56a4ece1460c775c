"""The strategy table: one class a strategy, discovered; everything that names strategies
(the --strategy help, auto's order, a change's words and JSON kind, a rule's suggested fix,
the generated fix module) reads it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies import (
    ADVICE_STRATEGY, AUTO_ORDER, NAMES, STRATEGIES, Site, describe, help_text, suggestion, suggestions, worded,
)
from dtype_doctor.fix.strategies.base import SAFE, UNSAFE
from dtype_doctor.records import FixSuggestion, Remedy

ROOT = Path(__file__).resolve().parents[1]


def test_every_strategy_module_is_discovered_in_autos_order() -> None:
    assert AUTO_ORDER == ("to-device", "mps-float32", "cast-component", "vae-fp32", "grad-scaler", "bnb-compute-dtype", "bnb-quant-storage", "bnb-fp32-cpu-offload", "fp8-exclude", "tf32-new-api", "cast-inputs", "autocast", "fp32-trainable", "keep-fp32", "half-model")
    assert NAMES == (*AUTO_ORDER, "auto")
    assert len({s.rank for s in STRATEGIES.values()}) == len(STRATEGIES)
    assert {s.applicability for s in STRATEGIES.values()} <= {SAFE, UNSAFE}
    assert [n for n, s in STRATEGIES.items() if s.applicability == UNSAFE] == ["half-model"]


def test_the_strategy_help_names_every_strategy_keep_fp32_included() -> None:
    text = help_text()
    assert all(f"{name}:" in text or f"{name} [unsafe]:" in text for name in STRATEGIES)
    out = subprocess.run(
        [sys.executable, "-m", "dtype_doctor", "fix", "--help"], capture_output=True, text=True,
        env={"PYTHONPATH": str(ROOT), "COLUMNS": "400", "PATH": ""}, cwd=ROOT, check=True,
    ).stdout
    out = re.sub(r"-\s+", "-", " ".join(out.split()))  # help wraps at hyphens: "keep-" / "fp32"
    assert "keep-fp32" in out and "half-model [unsafe]" in out


def test_a_change_is_said_in_its_strategys_words() -> None:
    assert describe(Change("cast-inputs", "input_ids", "int64", "float32")) == "cast input_ids float32 → int64"
    assert describe(Change("to-device", "x", "cuda:0", "cpu")) == "move x cpu → cuda:0"
    assert describe(Change("half-model", "model", "float16", "float32")).startswith("convert the model float32 → float16")
    assert describe(Change("keep-fp32", "encoder.block.0", "float32", "float16")) == "keep encoder.block.0 float32 instead of float16"
    assert describe(Change("unknown", "t", "x")) == "unknown t → x"


def test_the_json_keeps_the_kinds_reports_already_carry_and_adds_the_strategy() -> None:
    d = Change("cast-inputs", "labels", "int64", "int32").to_dict()
    assert d["kind"] == "cast-input" and d["strategy"] == "cast-inputs"
    assert Change("keep-fp32", "model", "float16", "float32").to_dict()["kind"] == "keep-fp32"  # SPEC's kind


def test_a_strategys_words_for_an_unnamed_target() -> None:
    assert suggestion("cast-inputs", "int64").description == "cast the input to int64 (.long()) where the pipeline produces it"
    autocast = suggestion("autocast", "bfloat16")
    assert autocast.applicability == SAFE and "torch.bfloat16" in autocast.description
    assert suggestion("half-model", "float16").applicability == UNSAFE
    assert suggestion("to-device", "cuda:0").description == "move the input to cuda:0, the model's device"


def test_a_findings_fixes_are_worded_from_its_remedies_and_hints() -> None:
    remedies = (
        Remedy("cast-inputs", "labels", "int64", "collator"),
        Remedy("cast-inputs", "pixel_values", "float16", "processor"),
        Remedy("autocast", "forward", "float16"),
    )
    fixes = suggestions(remedies, ["or set problem_type in the config"])
    assert [(f.strategy, f.applicability) for f in fixes] == [("cast-inputs", SAFE), ("autocast", SAFE), ("cast-inputs", "display-only")]
    assert fixes[0].description == "cast labels to int64 (.long()) and pixel_values to float16 where the pipeline produces them"
    assert "torch.amp.GradScaler" in fixes[1].description and fixes[2].description == "or set problem_type in the config"
    # made in model code: cast where it is made; a created tensor is named by its op and module
    made = suggestions([Remedy("to-device", "created:aten.arange.default@model.pos", "cuda:0", "model-code")])
    # (torch's name for the factory, never aten's overload; no literal device: the code names its own)
    assert made[0].description == "create the tensor torch.arange makes in model.pos on the model's device (cuda:0): pass device= the device of the tensors it meets"
    assert suggestions([Remedy("cast-inputs", "", "float32", "model-code")])[0].description == "cast the tensor to float32 where it is made"
    # a hint Remedy is worded like a remedy; advice alone loses its "or"
    assert suggestions([], [Remedy("keep-fp32", "encoder.0", "float32")])[0].description.endswith(", encoder.0 among them (--strategy keep-fp32)")
    assert suggestions([], ["or pass a bool mask"]) == (FixSuggestion(ADVICE_STRATEGY, "display-only", "pass a bool mask"),)
    # a strategy no module defines (yet) is said plainly, and never offered as safe
    assert suggestions([Remedy("dequantize", "lm_head", "float16")]) == (FixSuggestion("dequantize", "display-only", "dequantize lm_head → float16"),)


def test_a_rule_states_its_fix_as_data_and_the_finding_carries_the_words() -> None:
    from dtype_doctor.rules.base import Rule

    rule = Rule("DD999", "example", "error", "s", "w", "e", "f", "fs")
    remedy = Remedy("half-model", "model", "bfloat16", "model-loading")
    f = rule.finding("m", remedies=[remedy], hints=["or train in bfloat16"])
    assert f.fixes == ()  # the rule states its fix as data; the strategies word it, a layer up
    [f] = worded([f])
    assert f.remedies == (remedy,) and f.fixes == suggestions([remedy], ["or train in bfloat16"])
    assert f.fixes[0].applicability == UNSAFE and "dtype=torch.bfloat16" in f.fixes[0].description
    [hinted] = worded([rule.finding("m", hints=[remedy])])
    assert hinted.remedies == () and hinted.fixes == f.fixes[:1]  # shown, never applied
    # the older way, words written out, is still accepted and wins
    old = FixSuggestion("cast-inputs", SAFE, "cast it")
    assert worded([rule.finding("m", remedies=[remedy], fixes=[old])])[0].fixes == (old,)


def test_each_strategy_plans_its_edits_and_its_part_of_the_fix_module(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    site = Site(device_type="cuda", model_dtype="float32", script=script)
    assert [type(a.codemod).__name__ for a in STRATEGIES["to-device"].edits(Change("to-device", "x", "cuda:0", "cpu"), site)] == ["MoveBatchToDevice"]
    assert [type(a.codemod).__name__ for a in STRATEGIES["half-model"].edits(Change("half-model", "model", "float16"), site)] == ["AllOf"]
    assert STRATEGIES["keep-fp32"].edits(Change("keep-fp32", "model", "float16"), site) == []  # only the fix module takes it
    assert STRATEGIES["autocast"].edits(Change("autocast", "forward", "float16"), Site()) == []  # no script, no edit
    parts: dict = {}
    for c in (Change("cast-inputs", "labels", "int64"), Change("autocast", "forward", "bfloat16"),
              Change("keep-fp32", "model", "float16"), Change("keep-fp32", "lm_head", "float32")):
        STRATEGIES[c.kind].module_part(parts, c, site)
    assert parts["cast-inputs"] == {"casts": {"labels": "int64", "label": "int64", "label_ids": "int64"}}
    assert parts["autocast"] == {"dtype": "bfloat16", "device_type": "cuda"}
    assert parts["keep-fp32"] == {"modules": ["lm_head"], "dtype": "float16"}
