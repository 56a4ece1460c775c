"""The codemods the fallback chain adds: before/after strings for CastReturnedValue, RetargetCast
located by output key (any dtype family), and AllOf."""

from __future__ import annotations

import textwrap

from dtype_doctor.fix.codemods import AllOf, CastReturnedValue, RetargetCast, SetLoadDtype


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def test_cast_returned_value_wraps_a_dict_entry_with_the_file_s_torch() -> None:
    before = src("""
        import torch

        def prep(example):
            return {"input_ids": example["ids"], "mask": example["m"]}
    """)
    r = CastReturnedValue("prep", "input_ids", "int64").apply(before, "p.py")
    assert r.applied
    assert 'return {"input_ids": torch.as_tensor(example["ids"], dtype=torch.int64), "mask": example["m"]}' in r.new_source


def test_cast_returned_value_casts_a_returned_name_before_the_return_with_numpy() -> None:
    before = src("""
        import numpy as np

        def prep(example):
            out = {"input_ids": np.nan_to_num(np.full(4, np.nan))}
            return out
    """)
    r = CastReturnedValue("prep", "input_ids", "int64").apply(before, "p.py")
    assert r.applied
    assert '    out["input_ids"] = np.asarray(out["input_ids"], dtype=np.int64)\n    return out\n' in r.new_source


def test_cast_returned_value_binds_another_returned_mapping_and_casts_each_row_when_batched() -> None:
    before = src("""
        def prep(batch):
            return tokenizer(batch["text"])
    """)
    r = CastReturnedValue("prep", "input_ids", "int64").apply(before, "p.py")
    assert r.applied
    assert r.new_source.startswith("import torch\n")
    assert (
        '    outputs = tokenizer(batch["text"])\n'
        '    outputs["input_ids"] = [torch.as_tensor(row, dtype=torch.int64) for row in outputs["input_ids"]]\n'
        "    return outputs\n"
    ) in r.new_source


def test_cast_returned_value_casts_at_every_return_however_it_is_written() -> None:
    before = src("""
        import numpy as np


        def prep(example):
            out = {"label": example["label"]}
            out["input_ids"] = np.nan_to_num(np.full(8, np.nan)) + 3
            if example["label"] == 0: return out  # early
            if example["label"] == 1:
                return {"label": 1}
            n = 1; return out
    """)
    r = CastReturnedValue("prep", "input_ids", "int64").apply(before, "p.py")
    assert r.applied and "line 7, line 10" in r.detail
    assert r.new_source == src("""
        import numpy as np


        def prep(example):
            out = {"label": example["label"]}
            out["input_ids"] = np.nan_to_num(np.full(8, np.nan)) + 3
            if example["label"] == 0:  # early
                out["input_ids"] = np.asarray(out["input_ids"], dtype=np.int64)
                return out
            if example["label"] == 1:
                return {"label": 1}
            n = 1; out["input_ids"] = np.asarray(out["input_ids"], dtype=np.int64); return out
    """)


def test_cast_returned_value_puts_a_new_import_two_lines_above_the_def() -> None:
    r = CastReturnedValue("prep", "input_ids", "int64").apply('def prep(x):\n    return {"input_ids": [1.0]}\n', "p.py")
    assert r.new_source == 'import torch\n\n\ndef prep(x):\n    return {"input_ids": torch.as_tensor([1.0], dtype=torch.int64)}\n'


def test_cast_returned_value_skips_a_function_that_returns_nothing() -> None:
    r = CastReturnedValue("prep", "input_ids", "int64").apply("def prep(x):\n    print(x)\n", "p.py")
    assert r.status == "skipped" and "returns nothing" in r.detail


def test_retarget_by_key_crosses_dtype_families_and_leaves_other_keys() -> None:
    before = src("""
        import numpy as np

        def prep(example):
            ids = np.asarray(example["ids"]).astype(np.float32)
            pixels = np.asarray(example["px"]).astype(np.float32)
            return {"input_ids": ids, "pixel_values": pixels}
    """)
    r = RetargetCast("prep", "int64", key="input_ids").apply(before, "p.py")
    assert r.applied
    assert 'ids = np.asarray(example["ids"]).astype(np.int64)' in r.new_source
    assert 'pixels = np.asarray(example["px"]).astype(np.float32)' in r.new_source
    # Without a key or lines, a float cast is never made an integer one.
    assert RetargetCast("prep", "int64").apply(before, "p.py").status == "skipped"


def test_retarget_follows_a_list_built_with_append() -> None:
    before = src("""
        import torch

        def prep(batch):
            values = []
            for x in batch["x"]:
                values.append(torch.tensor(x).to(torch.float16))
            return {"pixel_values": values}
    """)
    r = RetargetCast("prep", "float32", key="pixel_values").apply(before, "p.py")
    assert r.applied and "values.append(torch.tensor(x).to(torch.float32))" in r.new_source


def test_all_of_applies_when_any_part_does() -> None:
    before = 'model = AutoModel.from_pretrained("m")\n'
    both = AllOf([SetLoadDtype("float16"), CastReturnedValue("nope", "x", "int64")])
    r = both.apply(before, "s.py")
    assert r.applied and "dtype=torch.float16" in r.new_source and r.codemod == "SetLoadDtype+CastReturnedValue"
    none = AllOf([CastReturnedValue("nope", "x", "int64")]).apply(before, "s.py")
    assert none.status == "skipped" and "no function nope()" in none.detail
