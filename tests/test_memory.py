"""Memory estimated before it is spent: a model too big for the machine is refused from its
config and headers (a real subprocess under RLIMIT_AS), an out-of-memory in the trace names the
batch size, rows over the limit are refused as they are read, bad configs are bad input."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from dtype_doctor.records.errors import InputError, is_out_of_memory, memory_words
from dtype_doctor.load.memory import MAX_ROW_BYTES
from tests.test_cli_bad_input import TEXT, assert_one_error_line, run_cli, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
LLAMA = REPO / "fixtures" / "models" / "llama-tiny"
BERT = REPO / "fixtures" / "models" / "bert-tiny"


def seventy_b(tmp: Path) -> Path:
    """llama-tiny's files under a 70B-class config.json (the weights do not matter: it must never load)."""
    d = tmp / "llama-70b"
    shutil.copytree(LLAMA, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, vocab_size=128256, head_dim=128)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_a_70b_config_is_refused_under_rlimit_as_before_anything_is_materialised(tmp_path: Path) -> None:
    model = seventy_b(tmp_path)
    before = tree_hash(model)
    limit = 8 * 2**30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dtype_doctor", "scan", str(model), str(TEXT)], capture_output=True,
                          text=True, env=env, preexec_fn=cap, timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = assert_one_error_line(proc.stderr, str(model), "needs about", "GiB", "RLIMIT_AS", "--simulate")
    assert "70,5" in line  # the 70.5B weights, counted from config.json on the meta device
    assert proc.stdout == "" and tree_hash(model) == before


def test_the_same_model_is_fine_with_simulate_where_no_weight_is_loaded(tmp_path: Path) -> None:
    from dtype_doctor.load.memory import estimate, header_elements
    from transformers import AutoConfig, LlamaForCausalLM

    model = seventy_b(tmp_path)
    est = estimate([model / "model.safetensors"], LlamaForCausalLM, AutoConfig.from_pretrained(model), "bfloat16", None)
    assert est.parameters > 70 * 10**9 and est.bytes == est.parameters * 2
    elements, stored, first = header_elements([LLAMA / "model.safetensors"])
    assert elements == sum(p.numel() for p in LlamaForCausalLM.from_pretrained(LLAMA).state_dict().values())
    assert first == "F32" and stored == elements * 4


class Greedy(torch.nn.Module):
    """A forward that asks the allocator for more than any machine has: a real allocation failure."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.zeros(2**60, dtype=torch.uint8).sum()


def test_out_of_memory_in_the_trace_is_raised_not_a_dd001_finding() -> None:
    from dtype_doctor import diagnose

    with pytest.raises(RuntimeError) as info:
        torch.zeros(2**60, dtype=torch.uint8)  # the oracle: plain PyTorch fails this allocation
    assert is_out_of_memory(info.value)
    with pytest.raises(Exception) as traced:
        diagnose(Greedy(), {"x": torch.ones(2, 4)})
    assert is_out_of_memory(traced.value)


def test_out_of_memory_names_the_batch_size() -> None:
    from dtype_doctor.pipeline import ScanOptions, memory_named

    with pytest.raises(InputError, match=r"out of memory with --batch-size 7 .*lower --batch-size"):
        with memory_named(ScanOptions(batch_size=7)):
            torch.zeros(2**60, dtype=torch.uint8)


def test_an_absurd_batch_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, ["scan", str(BERT), str(TEXT), "--batch-size", "1000000000000"])
    assert code == 2 and out == ""
    assert_one_error_line(err, "--batch-size 1000000000000")


def test_a_row_over_the_limit_in_a_tiny_parquet_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 2 * MAX_ROW_BYTES // 8  # int64 values: twice the limit once decoded
    ids = pa.ListArray.from_arrays(pa.array([0, n], type=pa.int32()), pa.array(np.zeros(n, dtype=np.int64)))
    f = tmp_path / "one-row.parquet"
    pq.write_table(pa.table({"input_ids": ids, "label": [0]}), f, compression="zstd")
    assert f.stat().st_size < 64 * 1024  # dictionary-encoded zeros: a few kB on disk
    code, out, err = run_cli(capsys, ["scan", str(BERT), str(f)])
    assert code == 2 and out == ""
    assert_one_error_line(err, str(f), "limit on one row")


def test_a_jsonl_line_over_the_limit_is_refused_before_it_is_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.jsonl"
    with f.open("w") as fh:
        fh.write('{"label": 0, "input_ids": [')
        fh.write("0," * (MAX_ROW_BYTES // 2 + 1))
        fh.write("0]}\n")
    code, out, err = run_cli(capsys, ["scan", str(BERT), str(f)])
    assert code == 2 and out == ""
    assert_one_error_line(err, str(f), "line 1", "limit on one row")


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_an_empty_jsonl_says_it_is_empty(tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text(content)
    code, _, err = run_cli(capsys, ["scan", str(BERT), str(f)])
    assert code == 2
    line = assert_one_error_line(err, str(f), "is empty")
    assert "StopIteration" not in line


@pytest.mark.parametrize("kind", ["deep", "enormous"])
def test_a_deep_or_enormous_config_json_is_bad_input_naming_it(tmp_path: Path, kind: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "m"
    shutil.copytree(BERT, d)
    cfg = json.loads((d / "config.json").read_text())
    text = json.dumps(cfg)[:-1]
    if kind == "deep":
        text += ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    else:
        text += ', "x": "' + "a" * (17 * 2**20) + '"}'
    (d / "config.json").write_text(text)
    code, _, err = run_cli(capsys, ["scan", str(d), str(TEXT)])
    assert code == 2
    assert_one_error_line(err, str(d / "config.json"))


PAIRWISE = '''import sys

import torch


class Pairwise(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x)
        return (h @ h.T).softmax(-1)  # batch x batch scores: memory grows with the square of the batch


model = Pairwise()
x = torch.randn(int(sys.argv[1]), 16)
print(model(x).sum().item())
'''


def test_run_names_an_out_of_memory_in_the_step_under_rlimit_as(tmp_path: Path) -> None:
    # A real allocation failure: 60,000 rows make 14.4 GB of scores, over a 4 GiB address-space cap.
    script = tmp_path / "pairwise.py"
    script.write_text(PAIRWISE)
    before = tree_hash(tmp_path)
    limit = 4 * 2**30

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    plain = subprocess.run([sys.executable, str(script), "60000"], capture_output=True, text=True, env=env,
                           preexec_fn=cap, timeout=120)
    assert plain.returncode == 1 and "can't allocate memory" in plain.stderr  # the oracle: the script alone fails
    proc = subprocess.run([sys.executable, "-m", "dtype_doctor", "run", "--", "python", str(script), "60000"],
                          capture_output=True, text=True, env=env, preexec_fn=cap, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr, "ran out of memory", f"{script.name}:13", "lower the batch size")
    assert proc.stdout == "" and tree_hash(tmp_path) == before
    # The size the allocator asked for, as its own message names it, is in the line too.
    asked = re.search(r"allocate \d+ bytes", plain.stderr)
    assert asked is not None and asked.group(0) in proc.stderr, (plain.stderr, proc.stderr)
    # A CPU step stays real under --simulate (it runs out there too): the line does not offer it.
    simulated = subprocess.run([sys.executable, "-m", "dtype_doctor", "run", "--simulate", "--", "python", str(script), "60000"],
                               capture_output=True, text=True, env=env, preexec_fn=cap, timeout=120)
    assert simulated.returncode == 2 and "ran out of memory" in simulated.stderr, simulated.stderr
    assert "--simulate" not in proc.stderr and "--simulate" not in simulated.stderr, (proc.stderr, simulated.stderr)


def test_run_offers_simulate_for_a_gpu_out_of_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # torch.OutOfMemoryError is what CUDA's allocator raises; --simulate fakes the script's GPU tensors.
    script = tmp_path / "gpu.py"
    script.write_text(PAIRWISE.replace("(h @ h.T).softmax(-1)", "_oom()").replace(
        "model = Pairwise()", "def _oom():\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')\n\n\nmodel = Pairwise()"))
    code, out, err = run_cli(capsys, ["run", "--", "python", str(script), "4"])
    assert code == 2 and out == ""
    assert_one_error_line(err, "ran out of memory", "Tried to allocate 20.00 GiB", "lower the batch size", "--simulate")


def test_fix_run_names_an_out_of_memory_in_the_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "greedy.py"
    script.write_text(PAIRWISE.replace("(h @ h.T).softmax(-1)", "h + torch.zeros(2**60, dtype=torch.uint8).sum()"))
    code, out, err = run_cli(capsys, ["fix", "--run", "--", "python", str(script), "4"])
    assert code == 2 and out == ""
    assert_one_error_line(err, "ran out of memory", f"{script.name}:13", "lower the batch size")


def test_an_out_of_memory_before_any_model_call_does_not_blame_the_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "early.py"
    script.write_text(PAIRWISE.replace("model = Pairwise()", "torch.zeros(2**60, dtype=torch.uint8)\nmodel = Pairwise()"))
    with pytest.raises(RuntimeError) as plain:
        torch.zeros(2**60, dtype=torch.uint8)  # the oracle: this allocation fails in plain PyTorch
    assert is_out_of_memory(plain.value)
    words = memory_words(plain.value)  # the allocator's line without its C++ location, the size kept
    assert not words.startswith("[enforce") and (str(2**60) in words) == (str(2**60) in str(plain.value))
    for simulate in ([], ["--simulate"]):  # the script's own allocation is real under --simulate too
        code, out, err = run_cli(capsys, ["run", *simulate, "--", "python", str(script), "4"])
        assert code == 2 and out == ""
        line = assert_one_error_line(err, "ran out of memory before calling a model", f"{script.name}:16")
        assert "batch size" not in line and "--simulate" not in line


# A forward holding one batch x sequence x 16384 float32 tensor: llama-tiny with a wide MLP
# (12 MB of weights, so the load estimate lets it start). 1024 rows of 128 tokens make the
# first gate_proj output 8 GiB, over a 4 GiB address-space cap.
WIDE_ROWS = 1024
WIDE_CAP = 4 * 2**30

PLAIN_FORWARD = '''import json, sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dtype_doctor.records.errors import is_out_of_memory

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
rows = [json.loads(line)["text"] for line in open(sys.argv[2])]
batch = tokenizer(rows, truncation=True, padding=True, return_tensors="pt")
print(tuple(batch["input_ids"].shape))
try:
    with torch.no_grad():
        model(**batch)
except Exception as exc:
    print(type(exc).__name__, is_out_of_memory(exc))
else:
    print("fits")
'''


def cap_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (WIDE_CAP, WIDE_CAP))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tmp/{wide-llama,rows.jsonl}, after the oracle: a plain load + forward of these rows fails under the cap."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("oom")
    model = root / "wide-llama"
    config = LlamaConfig.from_pretrained(LLAMA)
    config.intermediate_size = 16384
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(LLAMA / name, model / name)
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": "the cat sat on the mat " * 16}) + "\n" for _ in range(WIDE_ROWS)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    plain = subprocess.run([sys.executable, "-c", PLAIN_FORWARD, str(model), str(rows)], capture_output=True, text=True,
                           env=env, preexec_fn=cap_address_space, timeout=300)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [f"({WIDE_ROWS}, 128)", "RuntimeError True"], plain.stdout  # the step alone fails
    return root


def test_scan_names_the_batch_size_of_a_real_out_of_memory_under_rlimit_as(wide: Path) -> None:
    model, rows = wide / "wide-llama", wide / "rows.jsonl"
    before = tree_hash(wide)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dtype_doctor", "scan", str(model), str(rows), "--batch-size",
                           str(WIDE_ROWS)], capture_output=True, text=True, env=env, preexec_fn=cap_address_space,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert_one_error_line(proc.stderr, f"out of memory with --batch-size {WIDE_ROWS} ", "lower --batch-size", "--simulate")
    assert proc.stdout == "" and tree_hash(wide) == before


@contextmanager
def address_space_room(room: int) -> Iterator[None]:
    """This process's soft RLIMIT_AS lowered to what it maps now plus `room`, then restored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + room, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# In this process (a second interpreter would cost another torch import): 4 GiB of room, half the
# 8 GiB gate_proj output that the plain forward could not allocate under its own cap. compare's
# fp32 reference forward used to read "the fp32 forward fails ... `dtype-doctor scan` says why".
@pytest.mark.parametrize(("command", "words"), [("fix", ("lower --batch-size", "--simulate")), ("compare", ("lower --batch-size",))])
def test_fix_and_compare_name_the_batch_size_of_a_real_out_of_memory_under_rlimit_as(
        wide: Path, command: str, words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    model, rows = wide / "wide-llama", wide / "rows.jsonl"
    before = tree_hash(wide)
    with address_space_room(4 * 2**30):
        code, out, err = run_cli(capsys, [command, str(model), str(rows), "--batch-size", str(WIDE_ROWS)])
    assert code == 2, err
    assert_one_error_line(err, f"out of memory with --batch-size {WIDE_ROWS} ", *words)
    assert out == "" and tree_hash(wide) == before


class HalfHungry(torch.nn.Module):
    """Fits in float32, runs out of memory in float16: a fix's trial needing more than the trace did."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if h.dtype == torch.float16:
            h = h + torch.zeros(2**60, dtype=torch.uint8).sum()
        return h


def test_an_out_of_memory_in_a_fix_trial_is_raised_not_blamed_on_a_module() -> None:
    from dtype_doctor.fix.engine import fix_model
    from dtype_doctor.fix.keep_fp32 import minimal_fp32_set

    model, x = HalfHungry(), torch.ones(2, 4)
    assert model(x).dtype == torch.float32
    with pytest.raises(RuntimeError) as plain:
        HalfHungry().half()(x.half())  # the oracle: the float16 forward alone fails to allocate
    assert is_out_of_memory(plain.value)
    # It used to be a "failing" mix: keep-fp32 kept `proj` float32 and called the fix verified.
    with pytest.raises(RuntimeError) as searched:
        minimal_fp32_set(model, {"x": x})
    assert is_out_of_memory(searched.value)
    with pytest.raises(RuntimeError) as fixed:
        fix_model(model, {"x": x}, strategy="keep-fp32")
    assert is_out_of_memory(fixed.value)
    assert model.proj.weight.dtype == torch.float32  # the user's model untouched


def test_an_out_of_memory_in_the_fp32_reference_is_raised_not_missing_overflow_evidence() -> None:
    from dtype_doctor.fix.engine import activation_peaks

    with pytest.raises(RuntimeError) as info:
        activation_peaks(Greedy(), {"x": torch.ones(2, 4)})  # used to return {}: "no overflow seen"
    assert is_out_of_memory(info.value)
