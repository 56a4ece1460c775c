"""The user's line of a dropped move (issue 38): a batch or a model that reaches the model call by a plain
name, on the line that lost its `.to(device)`, in the shape of pytorch/examples' mnist
(tests/scripts_public_shapes/loader_loop.py: a DataLoader loop in train(), the model made in main())."""

from __future__ import annotations

import subprocess

import pytest
import torch

from dtype_doctor.source.bindings import call_at, last_binding, parameter_index
from test_public_shapes import T4, _cli, _errors, _line_of, _named_at, _python, _workspace

MOVED_BATCH = "        data, target = data.to(device), target.to(device)"
MOVED_MODEL = "    model = Net().to(device)"


def _device_mismatch_fails() -> None:
    # What the real step meets (CUDA's own check; here the stand-in device): a Linear refuses an input on another device.
    with pytest.raises(RuntimeError):
        torch.nn.Linear(8, 16).to("meta")(torch.randn(2, 8))


def test_the_shape_runs_plainly_and_clean_on_a_simulated_gpu(tmp_path, capsys, monkeypatch) -> None:
    root = _workspace(tmp_path, "loader_loop.py")
    assert _python(root, "loader_loop.py").returncode == 0
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "loader_loop.py"], capsys)
    assert code == 0 and _errors(report) == [], err[-2000:]


def test_a_batch_left_unmoved_is_named_at_the_line_that_dropped_its_move(tmp_path, capsys, monkeypatch) -> None:
    _device_mismatch_fails()
    dropped = "        data, target = data, target.to(device)"
    root = _workspace(tmp_path, "loader_loop.py", MOVED_BATCH, dropped)
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "loader_loop.py"], capsys)
    errors = _errors(report)
    assert code == 1 and [f["code"] for f in errors] == ["DD201"], err[-2000:]
    # not the for line that took the batch from the DataLoader: the next one, where `target` moved and `data` did not
    assert _named_at(errors[0], "loader_loop.py", _line_of(root, "loader_loop.py", dropped)), errors[0]["source"]
    # and fixed there: the move goes back on that line, so the loss that reads `data` later is on the GPU too
    code, report, err = _cli(["fix", "--run", *T4, "--write-patch", str(root / "fix.patch"), "-f", "json", "--",
                              "python", "loader_loop.py"], capsys)
    assert code == 0 and report["fix"]["verified"] is True, err[-2000:]
    patch = (root / "fix.patch").read_text()
    assert "+        data, target = data.to(device), target.to(device)" in patch, patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=root, check=True, capture_output=True)
    assert _python(root, "loader_loop.py").returncode == 0


def test_a_model_never_moved_is_named_where_it_was_made_through_the_callers_argument(tmp_path, capsys, monkeypatch) -> None:
    _device_mismatch_fails()
    root = _workspace(tmp_path, "loader_loop.py", MOVED_MODEL, "    model = Net()")
    monkeypatch.chdir(root)
    code, report, err = _cli(["run", *T4, "-f", "json", "--", "python", "loader_loop.py"], capsys)
    errors = _errors(report)
    assert code == 1 and errors and errors[0]["code"] == "DD201", err[-2000:]
    # train(model, ...) takes it as a parameter: the line is main()'s `model = Net()`
    assert _named_at(errors[0], "loader_loop.py", _line_of(root, "loader_loop.py", "    model = Net()")), errors[0]["source"]
    # what the script meets after the recovered forward is said as the device asked for, never the stand-in's
    assert "meta" not in err


def test_bindings_follow_assignments_loops_and_parameters(tmp_path) -> None:
    src = tmp_path / "s.py"
    src.write_text("def train(model, loader):\n"          # 1
                   "    for i, (x, y) in enumerate(loader):\n"  # 2
                   "        x = x\n"                        # 3
                   "        out = model(x)\n"               # 4
                   "    return out\n"                       # 5
                   "net = make()\n"                         # 6
                   "train(net, [])\n")                      # 7
    site = call_at(str(src), 4)
    assert site is not None and site.callee == "model" and site.positional == ("x",)
    assert last_binding(str(src), 4, "x") == 3 and last_binding(str(src), 3, "x") == 2
    assert last_binding(str(src), 4, "model") is None and parameter_index(str(src), 4, "model") == ("train", 0)
    outer = call_at(str(src), 7, callee="train")
    assert outer is not None and outer.positional == ("net", None) and last_binding(str(src), 7, "net") == 6
