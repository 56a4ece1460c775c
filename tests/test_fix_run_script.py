"""`fix --run`: the fix goes where the dtype or device was decided, and "verified" means the
patched script runs past the traced step, through its evaluation and checkpoint code.

Each script is in the shape of a public one (transformers' run_glue_no_trainer.py, a plain
PyTorch Dataset loop, pytorch/examples' word_language_model). The house pattern: run the
broken script plainly and see it fail, fix --run, `git apply` the patch to the copy, and run it
plainly again, to its end.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dtype_doctor.cli.main import run

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}

# transformers' examples/pytorch/text-classification/run_glue_no_trainer.py, shrunk to its shape:
# csv files, Dataset.map preprocessing, DataCollatorWithPadding, accelerate, a training loop, an
# evaluation loop and a save. The bug: the map function makes the labels float.
GLUE = '''\
import argparse

import torch
from accelerate import Accelerator
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_file")
    parser.add_argument("--validation_file")
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--max_train_steps", type=int, default=2)
    parser.add_argument("--output_dir", default=None)
    return parser.parse_args()


def main():
    args = parse_args()
    accelerator = Accelerator()
    raw_datasets = load_dataset("csv", data_files={"train": args.train_file, "validation": args.validation_file})
    label_list = sorted(raw_datasets["train"].unique("label"))
    config = AutoConfig.from_pretrained(args.model_name_or_path, num_labels=len(label_list))
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, config=config)
    label_to_id = {v: i for i, v in enumerate(label_list)}

    def preprocess_function(examples):
        result = tokenizer(examples["text"], padding=False, max_length=32, truncation=True)
        result["labels"] = LABELS
        return result

    processed = raw_datasets.map(preprocess_function, batched=True, remove_columns=raw_datasets["train"].column_names)
    collator = DataCollatorWithPadding(tokenizer)
    train_dataloader = DataLoader(processed["train"], shuffle=True, collate_fn=collator, batch_size=4)
    eval_dataloader = DataLoader(processed["validation"], collate_fn=collator, batch_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(model, optimizer, train_dataloader, eval_dataloader)
    model.train()
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 >= args.max_train_steps:
            break
    model.eval()
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        print("eval loss", outputs.loss.item())
    if args.output_dir is not None:
        accelerator.unwrap_model(model).save_pretrained(args.output_dir, save_function=accelerator.save)


if __name__ == "__main__":
    main()
'''
FLOAT_IN_MAP = '[float(label_to_id[l]) for l in examples["label"]]'
AS_READ = 'examples["label"]'  # labels read as they are, from a csv that stores them as floats

# A plain PyTorch loop whose torch Dataset makes the labels float in __getitem__.
GETITEM = '''\
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Tabular(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g).tolist()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": float(self.y[i])}


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in DataLoader(Tabular(16), batch_size=4, shuffle=True):
    loss = nn.functional.cross_entropy(model(batch["features"]), batch["label"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
model.eval()
with torch.no_grad():
    for batch in DataLoader(Tabular(8), batch_size=4):
        print("eval loss", nn.functional.cross_entropy(model(batch["features"]), batch["label"]).item())
torch.save(model.state_dict(), "model.pt")
'''

# pytorch/examples word_language_model/main.py's shape (device from --cuda, batchify moves the data
# to it, the model built in one line, train / evaluate functions, a save). The bug: the model's
# `.to(device)` dropped, so it stays on the CPU.
LEFT_ON_CPU = '''\
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--save", default="model.pt")
args = parser.parse_args()
device = torch.device("cuda" if args.cuda else "cpu")


class RNNModel(nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, nhid)
        self.rnn = nn.LSTM(nhid, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input):
        output, _ = self.rnn(self.encoder(input))
        return self.decoder(output)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


corpus = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(0))
train_data, val_data = batchify(corpus[:160], 4), batchify(corpus[160:], 4)
model = RNNModel(11, 8)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)


def train():
    model.train()
    for i in range(0, train_data.size(0) - 1, 5):
        data, targets = train_data[i : i + 5], train_data[i + 1 : i + 6]
        if data.size(0) != targets.size(0):
            continue
        loss = criterion(model(data).view(-1, 11), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def evaluate(source):
    model.eval()
    with torch.no_grad():
        return criterion(model(source[:-1]).view(-1, 11), source[1:].reshape(-1)).item()


train()
print("val loss", evaluate(val_data))
with open(args.save, "wb") as f:
    torch.save(model.state_dict(), f)
'''


@pytest.fixture
def workdir(git_workdir: Path) -> Path:
    return git_workdir


def _fix(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(["fix", "--run", "--write-patch", "fix.patch", "-f", "json", *argv])
    captured = capsys.readouterr()
    assert captured.out, captured.err[-3000:]  # a report on stdout, whatever the exit code
    return exit_info.value.code, json.loads(captured.out), captured.err


def _plain(workdir: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=workdir, capture_output=True, text=True, timeout=300, env=ENV)


def _added(patch: str) -> list[str]:
    return [line[1:].strip() for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]


def _glue(workdir: Path, labels: str, float_csv: bool = False) -> list[str]:
    (workdir / "run_glue_no_trainer.py").write_text(GLUE.replace("LABELS", labels))
    rows = list(csv.reader((FIX / "data/text-cls.csv").open()))
    for name in ("train.csv", "validation.csv"):
        with (workdir / name).open("w", newline="") as f:
            csv.writer(f).writerows([rows[0], *([text, f"{float(label)}" if float_csv else label] for text, label in rows[1:])])
    return ["--train_file", "train.csv", "--validation_file", "validation.csv", "--model_name_or_path", str(FIX / "models/bert-tiny")]


@pytest.mark.parametrize("launcher", [["python"], ["accelerate", "launch", "--num_processes", "1"]], ids=["python", "accelerate-launch"])
def test_float_labels_made_in_a_map_function_are_fixed_in_it(launcher: list[str], workdir: Path, capsys: pytest.CaptureFixture) -> None:
    args = _glue(workdir, FLOAT_IN_MAP)
    broken = _plain(workdir, "run_glue_no_trainer.py", *args)
    assert broken.returncode != 0 and "ValueError" in broken.stderr  # BCE on float labels: the shapes differ
    code, report, err = _fix(["--", *launcher, "run_glue_no_trainer.py", *args, "--output_dir", "out"], capsys)
    assert code == 0, err
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    line = next(i for i, text in enumerate(GLUE.splitlines(), 1) if "LABELS" in text)
    assert finding["source"] == {"file": "run_glue_no_trainer.py", "line": line}  # the map function, not the collator
    assert finding["stage"] == "preprocess"
    fix = report["fix"]
    assert fix["verified"] is True and fix["script"] == {"failed": None, "ran_on": "to its end"}
    patch = (workdir / "fix.patch").read_text()
    assert _added(patch) == ['result["labels"] = [int(label_to_id[l]) for l in examples["label"]]']  # one line, at the origin
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    plain = _plain(workdir, "run_glue_no_trainer.py", *args, "--output_dir", "out")
    assert plain.returncode == 0, plain.stderr[-2000:]  # train, evaluation and save: the whole script
    assert "eval loss" in plain.stdout and (workdir / "out/config.json").is_file()


def test_float_labels_made_in_getitem_are_fixed_in_it(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "train.py").write_text(GETITEM)
    broken = _plain(workdir, "train.py")
    assert broken.returncode != 0 and "RuntimeError" in broken.stderr  # a float class target
    code, report, err = _fix(["--", "python", "train.py"], capsys)
    assert code == 0, err
    line = next(i for i, text in enumerate(GETITEM.splitlines(), 1) if '"label": float(' in text)
    assert {f["source"]["line"] for f in report["findings"] if f["code"] == "DD104"} == {line}  # __getitem__, not the loop
    patch = (workdir / "fix.patch").read_text()
    assert _added(patch) == ['return {"features": self.x[i], "label": int(self.y[i])}']
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    (workdir / "model.pt").unlink(missing_ok=True)  # the verifying run wrote it, as the script does
    plain = _plain(workdir, "train.py")
    assert plain.returncode == 0 and "eval loss" in plain.stdout and (workdir / "model.pt").is_file(), plain.stderr[-2000:]


def test_a_model_left_on_the_cpu_moves_to_the_batch_device(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # On a GPU the script dies at the LSTM: PyTorch's "Expected all tensors to be on the same device"
    # (aten/src/ATen/native/cudnn/RNN.cpp checks its inputs' devices, as every CUDA op does through
    # TensorIterator's compute_types). The simulation sees that; the patch must move the model to the
    # device the script chose, never the batch to the CPU (the job would train on the CPU).
    (workdir / "main.py").write_text(LEFT_ON_CPU)
    code, report, err = _fix(["--simulate", "--gpu", "a100", "--", "python", "main.py", "--cuda"], capsys)
    assert code == 0, err
    device = [f for f in report["findings"] if f["code"] == "DD201"]
    assert len(device) == 1, device  # one placement, one finding (not one per layer, nor its backward)
    assert device[0]["remedies"][0]["target"] == "model" and device[0]["remedies"][0]["to"] == "cuda:0"
    assert report["fix"]["verified"] is True
    assert report["fix"]["script"]["ran_on"].startswith("to its model's next call")  # simulated: stopped there, not its end
    assert not (workdir / "model.pt").exists()  # a simulated run writes none of your files
    patch = (workdir / "fix.patch").read_text()
    assert _added(patch) == ["model = RNNModel(11, 8).to(device)"]
    assert ".cpu()" not in patch and '"cpu"' not in patch
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    plain = _plain(workdir, "main.py")  # this machine's device: the patched script runs to its end
    assert plain.returncode == 0 and "val loss" in plain.stdout and (workdir / "model.pt").is_file(), plain.stderr[-2000:]


def test_a_dataset_tensor_a_function_returned_on_the_cpu_moves_at_its_return(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # word_language_model's batchify lost its `.to(device)`: the batches are slices of the corpus tensor it
    # returned. The move belongs on its return, where the data's device is decided (train and val both),
    # not on the slice the step took.
    script = LEFT_ON_CPU.replace("    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)",
                                 "    data = data[: nbatch * bsz].view(bsz, -1).t().contiguous()\n    return data")
    script = script.replace("model = RNNModel(11, 8)", "model = RNNModel(11, 8).to(device)")
    assert script.count("return data\n") == 1 and ".to(device)" in script
    (workdir / "main.py").write_text(script)
    code, report, err = _fix(["--simulate", "--gpu", "t4", "--", "python", "main.py", "--cuda"], capsys)
    assert code == 0, err
    returned = next(i for i, text in enumerate(script.splitlines(), 1) if text == "    return data")
    (finding,) = [f for f in report["findings"] if f["code"] == "DD201"]
    assert finding["source"] == {"file": "main.py", "line": returned}
    assert report["fix"]["verified"] is True
    patch = (workdir / "fix.patch").read_text()
    assert _added(patch) == ["return data.to(device)"]
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    plain = _plain(workdir, "main.py")
    assert plain.returncode == 0 and "val loss" in plain.stdout, plain.stderr[-2000:]


# peft's examples/conditional_generation/peft_adalora_seq2seq.py shape: the map function tokenizes with
# return_tensors="pt" and the labels go float there; the dataset stores them as values and transformers'
# default_data_collator makes the batch's tensors anew. The evaluation loop reads the same column.
SEQ2SEQ = """\
import sys

import torch
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, default_data_collator

path = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForSeq2SeqLM.from_pretrained(path)
dataset = Dataset.from_dict({"sentence": ["good news", "bad news", "no news", "old news"] * 2,
                             "text_label": ["positive", "negative", "neutral", "neutral"] * 2})


def preprocess_function(examples):
    model_inputs = tokenizer(examples["sentence"], max_length=8, padding="max_length", truncation=True, return_tensors="pt")
    labels = tokenizer(examples["text_label"], max_length=3, padding="max_length", truncation=True, return_tensors="pt")
    labels = labels["input_ids"].float()
    labels[labels == tokenizer.pad_token_id] = -100
    model_inputs["labels"] = labels
    return model_inputs


processed = dataset.map(preprocess_function, batched=True, remove_columns=dataset.column_names)
train_dataloader = DataLoader(processed, batch_size=4, collate_fn=default_data_collator, shuffle=True)
eval_dataloader = DataLoader(processed, batch_size=4, collate_fn=default_data_collator)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for batch in train_dataloader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
model.eval()
for batch in eval_dataloader:
    with torch.no_grad():
        print("eval loss", model(**batch).loss.item())
"""


def test_float_labels_a_map_function_returned_as_tensors_are_fixed_in_it(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "seq2seq.py").write_text(SEQ2SEQ)
    model = str(FIX / "models/t5-tiny")
    broken = _plain(workdir, "seq2seq.py", model)
    assert broken.returncode != 0 and "RuntimeError" in broken.stderr  # float decoder ids into an embedding
    code, report, err = _fix(["--", "python", "seq2seq.py", model], capsys)
    assert code == 0, err
    line = next(i for i, text in enumerate(SEQ2SEQ.splitlines(), 1) if ".float()" in text)
    assert {f["source"]["line"] for f in report["findings"] if f["severity"] == "error"} == {line}  # the map, not the collator
    patch = (workdir / "fix.patch").read_text()
    assert _added(patch) == ['labels = labels["input_ids"].long()']
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    plain = _plain(workdir, "seq2seq.py", model)
    assert plain.returncode == 0 and "eval loss" in plain.stdout, plain.stderr[-2000:]  # the evaluation loop too


# peft's olora_finetuning.py / alpaca-lora's shape: the map function returns what a helper of the script's
# (`tokenize`) built, and the float token ids are made in the helper.
THROUGH_A_HELPER = """\
import torch, datasets
from torch.utils.data import DataLoader


def main():
    ds = datasets.Dataset.from_dict({"text": ["a b", "b c", "c a", "a a"]})
    vocab = {"a": 1, "b": 2, "c": 3}

    def tokenize(prompt):
        result = {"input_ids": [vocab[w] for w in prompt.split()]}
        result["input_ids"] = [float(t) for t in result["input_ids"]]
        result["labels"] = result["input_ids"].copy()
        return result

    def describe(example):
        return "".join(example["text"])

    def generate_and_tokenize_prompt(example):
        full_prompt = describe(example)
        return tokenize(example["text"])

    data = ds.map(generate_and_tokenize_prompt, remove_columns=["text"])
    data.set_format("torch")
    model = torch.nn.Embedding(10, 4)
    for batch in DataLoader(data, batch_size=2):
        model(batch["input_ids"])


main()
"""


def test_float_ids_a_map_functions_helper_made_are_fixed_in_the_helper(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "tokenize_helper.py").write_text(THROUGH_A_HELPER)
    broken = _plain(workdir, "tokenize_helper.py")
    assert broken.returncode != 0 and "RuntimeError" in broken.stderr  # float indices into an embedding
    code, report, err = _fix(["--", "python", "tokenize_helper.py"], capsys)
    assert code == 0, err
    line = next(i for i, text in enumerate(THROUGH_A_HELPER.splitlines(), 1) if "float(t)" in text)
    assert {f["source"]["line"] for f in report["findings"] if f["severity"] == "error"} == {line}  # not the map function's def
    assert _added((workdir / "fix.patch").read_text()) == ['result["input_ids"] = [int(t) for t in result["input_ids"]]']
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    assert _plain(workdir, "tokenize_helper.py").returncode == 0


# peft's peft_adalora_seq2seq.py loop: the map tokenizes with return_tensors="pt", the loop moves the batch in a
# dict comprehension and calls `model(**batch)`. With the `.to(device)` dropped, the move belongs on that line,
# not on the map's (where the tensors were made, on the CPU as they should be).
UNPACKED_BATCH = """\
import torch, datasets
from torch.utils.data import DataLoader
from transformers import default_data_collator

device = "cuda"
ds = datasets.Dataset.from_dict({"x": [[1, 2, 3]] * 8})


def prep(examples):
    return {"input_ids": torch.tensor(examples["x"])}


ds = ds.map(prep, batched=True, remove_columns=["x"])
dl = DataLoader(ds, batch_size=4, collate_fn=default_data_collator)


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids):
        return self.emb(input_ids)


model = M().to(device)
for batch in dl:
    batch = {k: v for k, v in batch.items()}
    out = model(**batch)
"""


def test_a_batch_passed_as_keywords_names_the_line_that_bound_it(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "unpacked.py").write_text(UNPACKED_BATCH)
    code, report, err = _fix(["--simulate", "--gpu", "t4", "--", "python", "unpacked.py"], capsys)
    assert code == 0, err
    line = next(i for i, text in enumerate(UNPACKED_BATCH.splitlines(), 1) if "batch = {k: v" in text)
    (finding,) = [f for f in report["findings"] if f["code"] == "DD201"]
    assert finding["source"] == {"file": "unpacked.py", "line": line}
    assert _added((workdir / "fix.patch").read_text()) == ["batch = {k: v.to(device) for k, v in batch.items()}"]


def test_an_edit_that_cures_only_the_step_is_not_verified(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    # The csv stores the labels as floats and the map function passes them on: no cast to rewrite at the
    # origin. Casting the batch before the training forward cures the traced step; the evaluation loop
    # then dies of the same error. That is said, and fix exits 1.
    args = _glue(workdir, AS_READ, float_csv=True)
    code, report, err = _fix(["--", "python", "run_glue_no_trainer.py", *args], capsys)
    fix = report["fix"]
    assert code == 1 and fix["verified"] is False, err
    eval_line = max(i for i, text in enumerate(GLUE.splitlines(), 1) if "outputs = model(**batch)" in text)  # the evaluation loop's
    assert fix["script"]["failed"].startswith(f" at run_glue_no_trainer.py:{eval_line} with RuntimeError")
    assert fix["detail"].startswith("cures the traced step; the script then fails at run_glue_no_trainer.py:")
    subprocess.run(["git", "apply", "fix.patch"], cwd=workdir, check=True)
    plain = _plain(workdir, "run_glue_no_trainer.py", *args)
    assert plain.returncode != 0 and "eval loss" not in plain.stdout  # what the report said: it still fails


HANGS_ON = '''\
import time
import torch
model = torch.nn.Linear(4, 2).half()
for step in range(3):
    print(model(torch.randn(3, 4)).sum())
while True:
    time.sleep(0.05)
'''


def test_horizon_bounds_the_run_past_the_step(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "serve.py").write_text(HANGS_ON)
    code, report, err = _fix(["--horizon", "1", "--", "python", "serve.py"], capsys)
    assert code == 0, err
    assert report["fix"]["script"] == {"failed": None, "ran_on": "for 1 s past the step (--horizon)"}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["fix", "--horizon", "2", "m", "d"], "--horizon is for --run"),
        (["fix", "--run", "--horizon", "0", "--", "python", "s.py"], "--horizon must be"),
    ],
)
def test_horizon_usage_errors(argv: list[str], says: str, workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "s.py").write_text("print(1)\n")
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


# Every layer of a model left on the CPU meets the batch the script moved on one line: one
# placement, one finding, one edit (it was one DD201 per Linear, and the fix box listed the same
# rejected edit and remaining finding once for each).
SEQUENTIAL = '''\
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(4, 8).to(device), torch.tensor([0, 1, 2, 0]).to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
'''


def test_one_placement_is_one_finding_and_one_edit(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    (workdir / "loop.py").write_text(SEQUENTIAL)
    code, report, err = _fix(["--simulate", "--", "python", "loop.py"], capsys)
    assert code == 0, err
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == ["DD201"]
    fix = report["fix"]
    assert [s["status"] for s in fix["applied"]] == ["applied"] and "rejected" not in fix and "remaining" not in fix
    assert [e["status"] for e in fix["patch"]["edits"]] == ["applied"]
    assert _added((workdir / "fix.patch").read_text()) == ["model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)"]
