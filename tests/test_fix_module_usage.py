"""The generated dtype_doctor_fix.py runs exactly as its docstring says: every Python block the
docstring shows under "How to use it" (and the datasets transform after it) is executed as written,
beside the module, with the names a user's pipeline has (model, batch, dataset, tokenizer, torch)."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dtype_doctor.fix.codemods import NewFixModule

BERT = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "bert-tiny"
TEXTS = ["It broke on day two.", "Works as described.", "Love it!", "Meh."]

MODULES = {
    # the casts with the tokenizer's transform, and the forward under autocast
    "casts+autocast, tokenizer transform": dict(
        parts=[("cast-inputs", {"casts": {"labels": "int64"}}), ("autocast", {"dtype": "bfloat16"})],
        transform={"kind": "text", "column": "text", "max_length": 16},
    ),
    # the user's own function as the transform, which takes the tokenizer
    "casts, user transform": dict(
        parts=[("cast-inputs", {"casts": {"labels": "int64"}})],
        transform={"kind": "user", "path": "prep.py", "function": "prep", "batched": True, "accepts": ["tokenizer"]},
    ),
    "fp32-trainable alone": dict(parts=[("fp32-trainable", {})]),
}
PREP = "def prep(batch, tokenizer=None):\n    return tokenizer(batch['text'], truncation=True, max_length=16)\n"


def usages(module_text: str) -> list[str]:
    """The code blocks of the module's docstring (indented by four spaces), as written."""
    doc = ast.get_docstring(ast.parse(module_text)) or ""
    blocks, current = [], []
    for line in [*doc.splitlines(), ""]:
        if line.startswith("    "):
            current.append(line)
        elif current:
            blocks.append(textwrap.dedent("\n".join(current)))
            current = []
    return blocks


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_usage_the_docstring_shows_runs_as_written(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    text = NewFixModule(findings=["DD104 labels int32"], **MODULES[name]).apply("", NewFixModule.FILENAME).new_source
    assert text is not None
    (tmp_path / NewFixModule.FILENAME).write_text(text)
    monkeypatch.delitem(sys.modules, NewFixModule.FILENAME.removesuffix(".py"), raising=False)  # each test's own module
    (tmp_path / "prep.py").write_text(PREP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(BERT)
    model = AutoModelForSequenceClassification.from_pretrained(BERT)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    batch["labels"] = torch.tensor([0, 1, 2, 1], dtype=torch.int32)
    dataset = Dataset.from_dict({"text": TEXTS, "labels": [0, 1, 2, 1]})
    blocks = usages(text)
    assert blocks, text
    for block in blocks:
        if block.startswith("dtype-doctor "):
            continue  # the check command, run by tests/test_fix_e2e.py
        names = {"model": model, "batch": batch, "dataset": dataset, "tokenizer": tokenizer, "torch": torch}
        exec(compile(block, f"{NewFixModule.FILENAME} docstring", "exec"), names)  # noqa: S102 - the docstring's own code
        if "with_transform" in block:
            rows = names["dataset"][:2]  # the transform runs as rows are read
            # a transform hands datasets one value a row: each label an int64 tensor, the ids the tokenizer's
            assert [t.dtype for t in rows["labels"]] == [torch.int64, torch.int64] and len(rows["input_ids"]) == 2, rows
        elif "outputs" in names:
            assert torch.isfinite(names["outputs"].logits).all()
