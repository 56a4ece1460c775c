"""The trace leaves the script's objects as they are: while a step is traced, the script's own
`torch.save(model, f)`, `pickle` and `copy.deepcopy` of its model see none of the doctor's hooks,
and the checkpoint a real run writes is byte for byte the plain script's.

Built on the shape of pytorch/examples word_language_model (tests/scripts/realstyle/word_lm):
an LSTM saved whole with `with open(args.save, "wb") as f: torch.save(model, f)`.
"""

from __future__ import annotations

import copy
import copyreg
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import weakref
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from dtype_doctor.trace.unseen import hook_module, unhook

WORD_LM = Path(__file__).resolve().parent / "scripts" / "realstyle" / "word_lm"


class _Watcher:
    """What a recorder is to pickle: an object that holds weak references."""

    def __init__(self) -> None:
        self.me = weakref.ref(self)
        self.calls = 0

    def pre(self, mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.calls += 1

    def post(self, mod: torch.nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        pass


_USER_CALLS: list[int] = []


def _user_hook(mod: torch.nn.Module, args: tuple, out: object) -> None:
    _USER_CALLS.append(1)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LSTM(4, 4))


def test_plain_hooks_holding_weak_references_break_the_scripts_save() -> None:
    net, watcher = _net(), _Watcher()
    net.register_forward_pre_hook(watcher.pre, with_kwargs=True)
    with pytest.raises(TypeError):
        pickle.dumps(net)
    f = io.BytesIO()
    with pytest.raises(TypeError):
        torch.save(net, f)
    assert 0 < len(f.getvalue())  # the half-written file the user was left with


def test_hidden_hooks_run_but_copies_are_the_plain_modules() -> None:
    net, watcher = _net(), _Watcher()
    _USER_CALLS.clear()
    user = net[0].register_forward_hook(_user_hook)  # the script's own hook (picklable), kept
    plain_with_user = pickle.dumps(net)
    handles = [h for m in net.modules() for h in hook_module(m, watcher.pre, watcher.post)]
    net(torch.ones(2, 4))
    assert watcher.calls == 3 and _USER_CALLS == [1]
    assert pickle.dumps(net) == plain_with_user  # the bytes of the plain module, the user's hook in them
    f = io.BytesIO()
    torch.save(net, f)
    f.seek(0)
    loaded = torch.load(f, weights_only=False)
    assert [len(m._forward_pre_hooks) + len(m._forward_hooks_with_kwargs) for m in loaded.modules()] == [0, 0, 0]
    twin = copy.deepcopy(net)
    assert twin[0]._forward_hooks.keys() == net[0]._forward_hooks.keys() - {h.id for h in handles}
    assert not twin[1]._forward_pre_hooks and twin[1].weight_ih_l0.equal(net[1].weight_ih_l0)
    user.remove()  # the user's handle still reaches the dict torch made
    unhook(handles)
    assert OrderedDict not in copyreg.dispatch_table
    assert not net[0]._forward_hooks and not net[1]._forward_pre_hooks


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_real_run_saves_the_plain_scripts_checkpoint(tmp_path: Path) -> None:
    plain, doctored = tmp_path / "plain", tmp_path / "doctored"
    shutil.copytree(WORD_LM, plain)
    shutil.copytree(WORD_LM, doctored)
    # run traces one step (it stops at the second forward): the plain script with one batch saves the same model
    subprocess.run([sys.executable, "main.py", "--batches", "1"], cwd=plain, check=True, capture_output=True, timeout=120)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-m", "dtype_doctor", "run", "-f", "json", "--", "python", "main.py"],
                          cwd=doctored, capture_output=True, text=True, timeout=300, env=env)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and not report["findings"], (report["findings"], done.stderr[-2000:])
    assert _sha(doctored / "model.pt") == _sha(plain / "model.pt")  # the bytes the plain script writes
    load = "import torch; print(type(torch.load('model.pt', weights_only=False)).__name__)"
    assert subprocess.run([sys.executable, "-c", load], cwd=doctored, capture_output=True, text=True, check=True).stdout.strip() == "RNNModel"
