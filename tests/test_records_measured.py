"""OpCall.measured / ModuleCall.measured build the record positionally (the recorder calls them for
every op of every trace, where dataclasses.replace cost several times as much): they must stay
field for field what replace gives, whatever fields the records gain."""

from __future__ import annotations

import dataclasses

from dtype_doctor.records import ModuleCall, OpCall, TensorMeta, ValueStats


def _distinct(cls: type) -> dict:
    """A value for every field of `cls`, each different from its default."""
    meta = TensorMeta("float16", "cpu", (2, 3), "weight", "w", "param:w")
    values = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        if f.name.endswith("stats"):
            values[f.name] = ValueStats(absmax=float(i), nonfinite_any=False, min_nonzero=None, nonfinite=0.0,
                                        below_fp16_normal=0.0, below_fp16_normal_scaled=0.0, sampled=i, numel=i)
        elif f.type in ("int",):
            values[f.name] = i + 7
        elif f.type in ("bool",):
            values[f.name] = True
        elif "TensorMeta" in str(f.type):
            values[f.name] = (meta,) * (i % 3 + 1)
        elif f.name == "attrs":
            values[f.name] = (("k", i),)
        else:
            values[f.name] = f"{f.name}-{i}"
    return values


def test_opcall_measured_is_replace_field_for_field() -> None:
    op = OpCall(**_distinct(OpCall))
    stats, operand_stats = ValueStats(1.0, True, 0.5, 0.1, 0.2, 0.3, 10, 20), ValueStats(2.0, False, None, 0.0, 0.0, 0.0, 5, 5)
    attrs = (("fp32_kept", True),)
    assert op.measured(stats, operand_stats, attrs) == dataclasses.replace(op, stats=stats, operand_stats=operand_stats, attrs=attrs)


def test_modulecall_measured_is_replace_field_for_field() -> None:
    call = ModuleCall(**_distinct(ModuleCall))
    stats, input_stats = ValueStats(1.0, True, 0.5, 0.1, 0.2, 0.3, 10, 20), None
    assert call.measured(stats, input_stats) == dataclasses.replace(call, stats=stats, input_stats=input_stats)
