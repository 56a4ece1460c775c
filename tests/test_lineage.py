"""run/lineage.py on its own: the chain of user lines that made each tensor a script feeds its model.

This file is the "user's script" here: the tensors are made on its lines, and the chains must
name those lines, in this file.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import torch
import torch.nn as nn

from dtype_doctor.records import LineageStep, SourceLoc
from dtype_doctor.run.lineage import LineageBook, LineageMode, boundary_lineage, patch_datasets, sources_of

HERE = os.path.basename(__file__)


def line() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno  # type: ignore[union-attr]


def watching(paused: list[bool] | None = None) -> tuple[LineageBook, LineageMode]:
    paused = paused if paused is not None else [False]
    book = LineageBook(is_paused=lambda: paused[0])
    return book, LineageMode(book)


def test_a_tensor_made_and_cast_on_user_lines_names_both_lines() -> None:
    book, mode = watching()
    with mode:
        labels = torch.tensor([0, 1], dtype=torch.int32); made = line()  # noqa: E702
        labels = labels.to(torch.float16); cast = line()  # noqa: E702
    steps = book.chain(labels)
    assert [(s.dtype, s.source.line) for s in steps] == [("int32", made), ("float16", cast)]
    assert all(s.source.file.endswith(HERE) for s in steps)
    assert "cast to float16" in steps[-1].detail


def test_ops_that_keep_the_dtype_pass_the_chain_on() -> None:
    book, mode = watching()
    with mode:
        x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
        batch = torch.stack([x[0], x[1]])[:, :1]
    assert book.chain(batch) == book.chain(x) and len(book.chain(x)) == 1


def test_from_numpy_is_seen_although_torch_function_modes_never_see_it() -> None:
    book, mode = watching()
    with mode:
        t = torch.from_numpy(np.zeros(3)); made = line()  # noqa: E702
    [step] = book.chain(t)
    assert (step.dtype, step.source.line) == ("float64", made)
    assert torch.from_numpy.__module__ == "torch"  # the wrapper is gone again


def test_a_paused_book_records_nothing() -> None:
    paused = [True]
    book, mode = watching(paused)
    with mode:
        t = torch.ones(2).half()
    assert book.chain(t) == ()


def test_the_boundary_names_inputs_by_the_forward_parameters() -> None:
    class Model(nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return input_ids

    book, mode = watching()
    with mode:
        ids = torch.tensor([[1, 2]], dtype=torch.int32)
        mask = torch.ones(1, 2)
    lineage = boundary_lineage(book, Model(), (ids,), {"attention_mask": mask})
    assert set(lineage) == {"input_ids", "attention_mask"}
    assert [s.stage for s in lineage["input_ids"]][-1] == "model-boundary"
    assert lineage["input_ids"][-1].dtype == "int32"


def test_the_source_is_the_line_that_decided_the_final_dtype_not_the_last_one() -> None:
    decided, later = SourceLoc("prep.py", 12), SourceLoc("train.py", 40)
    chain = (
        LineageStep("dataset", "float32"),
        LineageStep("preprocess", "float16", source=decided),
        LineageStep("transfer", "float16", "cuda:0", source=later),
        LineageStep("model-boundary", "float16", "cuda:0"),
    )
    assert sources_of({"pixel_values": chain}) == {"pixel_values": decided}
    # No step with a line decided it: the last user line it passed.
    assert sources_of({"x": (LineageStep("dataset", "float32"), LineageStep("transfer", "float32", source=later))}) == {"x": later}


def test_a_map_functions_half_column_comes_back_from_arrow_as_float32_and_says_so() -> None:
    from datasets import Dataset

    def prep(row):
        return {"x": torch.tensor(row["x"]).to(torch.float16)}

    cast_line = inspect.getsourcelines(prep)[1] + 1
    book, mode = watching()
    undo = patch_datasets(book)
    try:
        with mode:
            ds = Dataset.from_dict({"x": [[1.0, 2.0], [3.0, 4.0]]}).map(prep).with_format("torch")
            row = ds[0]
    finally:
        undo()
    steps = book.chain(row["x"])
    assert row["x"].dtype == torch.float32  # datasets' torch formatter: floats come back float32
    assert [s.dtype for s in steps][-2:] == ["float16", "float32"]
    assert steps[-2].source.line == cast_line and steps[-1].stage == "formatter"
    assert Dataset.__getitem__.__module__.startswith("datasets")  # the patch is undone


def test_a_map_with_num_proc_1_runs_in_this_process_and_keeps_its_lineage() -> None:
    """datasets >= 4 runs `map(f, num_proc=1)` in a pool of one, which pickles the function: the wrapped one (it
    holds the book) failed to pickle and the script stopped (peft's peft_adalora_seq2seq.py). The same work runs here."""
    from datasets import Dataset

    def prep(row):
        return {"x": torch.tensor(row["x"]).to(torch.float16), "pid": os.getpid()}

    cast_line = inspect.getsourcelines(prep)[1] + 1
    data = {"x": [[1.0, 2.0], [3.0, 4.0]]}
    assert Dataset.from_dict(data).map(prep, num_proc=1)[0]["pid"] != os.getpid()  # plainly: another process
    book, mode = watching()
    undo = patch_datasets(book)
    try:
        with mode:
            row = Dataset.from_dict(data).map(prep, num_proc=1).with_format("torch")[0]
    finally:
        undo()
    assert int(row["pid"]) == os.getpid()
    assert book.chain(row["x"])[-2].source.line == cast_line


def test_a_refused_call_is_kept_only_until_a_step_starts() -> None:
    """run.before_model judges the last refused torch call when no model ran; once a step has started, a
    refusal the script catches (in a loop, say) is not kept: its operands and traceback would be held."""
    book, mode = watching()
    x, w = torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2)
    with mode:
        try:
            x.mm(w)
        except RuntimeError:
            pass
        assert book.raised is not None and book.raised.op == "mm"
        book.step_started()
        assert book.raised is None
        try:
            x.mm(w)
        except RuntimeError:
            pass
    assert book.raised is None


FSDP2_TO_EMPTY = '''\
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
with torch.device("meta"):  # pytorch/examples distributed/FSDP2/example.py: build on meta, shard, materialize
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 4))
for layer in model:
    fully_shard(layer)
fully_shard(model)
model.to_empty(device="cpu")
for m in model:
    m.reset_parameters()
loss = model(torch.randint(0, 16, (2, 5))).sum()
loss.backward()
print("trained", type(model[0].weight).__name__)
dist.destroy_process_group()
'''


def test_fsdp2_parameters_swap_under_run(tmp_path, monkeypatch, capsys) -> None:  # noqa: ANN001
    """FSDP2's DTensor parameters convert by torch.utils.swap_tensors, which refuses a tensor anything holds a
    weak reference to: the book's references to the sharded parameters stopped `model.to_empty(...)` under
    `run` ("_apply(): Couldn't swap FSDPEmbedding.weight"), blamed on the script, which runs plainly."""
    import subprocess
    import sys

    from helpers_cli import run_json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fsdp.py").write_text(FSDP2_TO_EMPTY)
    plain = subprocess.run([sys.executable, "fsdp.py"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "trained DTensor" in plain.stdout, plain.stderr
    code, report, err = run_json(["run", "-f", "json", "--", "python", "fsdp.py"], capsys)
    assert code == 0 and report is not None and "swap" not in err, err
