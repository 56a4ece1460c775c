"""Real-style training scripts (tests/scripts/realstyle/) with one bug injected each, for `fix --run`.

Each script is clean as written; a `Bug` is a text substitution in one of its files, the way a
user's own edit would break it. `workspace()` copies the scripts into a git repository (the user's
project), writes the GPT's data, and injects the bugs, so `fix --run --write-patch` can be checked
with `git apply` exactly as a user would apply it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REALSTYLE = Path(__file__).resolve().parent / "scripts" / "realstyle"
FIXTURES = ROOT / "fixtures"
BERT = str(FIXTURES / "models" / "bert-tiny")
TEXT = "data/text-cls"  # a copy in the workspace: datasets.map writes its cache files beside the data


@dataclass(frozen=True)
class Bug:
    """One mistake: `old` becomes `new` in `file` (a path relative to the workspace)."""

    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Script:
    """How the user runs one of the scripts: the command words after `python`."""

    argv: tuple[str, ...]
    cwd: str = "."  # where the user runs it, relative to the workspace

    def command(self) -> list[str]:
        return ["python", *self.argv]


GPT = Script(("train.py",), "gpt")
GPT_FP16 = Script(("train.py", "--dtype=float16"), "gpt")
ACCELERATE = Script(("accelerate_nlp.py", BERT, TEXT))
TRAINER = Script(("trainer_classify.py", BERT, TEXT, "out"))
SEQUENTIAL = Script(("sequential_loop.py",))

INT32_TARGETS = Bug(
    "gpt/train.py",
    "y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])",
    "y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int32)) for i in ix])",
)
ARANGE_NO_DEVICE = Bug(
    "gpt/model.py",
    "pos = torch.arange(0, t, dtype=torch.long, device=device)",
    "pos = torch.arange(0, t, dtype=torch.long)",
)
TARGETS_NOT_MOVED = Bug(
    "gpt/train.py",
    "x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)",
    "x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory()",
)
# Half weights from a helper that returns the model converted by a dtype held in a variable: no
# edit of the doctor's can undo it (the conversion names no dtype, and a return binds no model).
GPT_HALF_IN_BUILDER = Bug(
    "gpt/train.py",
    "model = GPT(GPTConfig(block_size=block_size))\nmodel.to(device)\n",
    "def build_model():\n    return GPT(GPTConfig(block_size=block_size)).to(device, dtype=ptdtype)  # fp16 to save memory\n\n\n"
    "model = build_model()\n",
)
ACCELERATE_HALF = Bug(
    "accelerate_nlp.py",
    "    model = model.to(accelerator.device)\n",
    "    model = model.to(accelerator.device)\n    model.half()  # fp16 weights to save memory\n",
)
TRAINER_HALF_LOAD = Bug(
    "trainer_classify.py",
    "AutoModelForSequenceClassification.from_pretrained(model_dir)",
    "AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float16)",
)
# The half dtype chosen in a variable and loaded by name (diffusers' train_llada2.py's shape).
TRAINER_HALF_LOAD_BY_NAME = Bug(
    "trainer_classify.py",
    "model = AutoModelForSequenceClassification.from_pretrained(model_dir)",
    "load_dtype = torch.float16 if torch.cuda.is_available() else torch.float32\n"
    "model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=load_dtype)",
)
# The map function makes the token ids Python floats (gralora_finetuning.py's shape): the collator's tokenizer.pad refuses them.
FLOAT_IDS_IN_MAP = Bug(
    "accelerate_nlp.py",
    "        return tokenizer(examples[\"text\"], truncation=True, max_length=32)\n",
    "        out = tokenizer(examples[\"text\"], truncation=True, max_length=32)\n"
    "        out[\"input_ids\"] = [[float(t) for t in ids] for ids in out[\"input_ids\"]]\n"
    "        return out\n",
)
SEQUENTIAL_HALF = Bug("sequential_loop.py", "model.to(device)\n", "model.to(device)\nmodel.half()\n")


def workspace(root: Path, *bugs: Bug) -> Path:
    """The scripts as a user's git repository under `root`, committed clean, then the bugs injected
    (left uncommitted, as the user's working tree has them: `git apply` patches the working tree)."""
    import numpy as np

    shutil.copytree(REALSTYLE, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(FIXTURES / "data" / "text-cls", root / TEXT, ignore=shutil.ignore_patterns("cache-*"))
    (root / "gpt" / "data").mkdir(exist_ok=True)
    for split in ("train", "val"):
        np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16).tofile(root / "gpt" / "data" / f"{split}.bin")
    (root / ".gitignore").write_text("__pycache__/\nout/\n*.patch\ncache-*.arrow\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "user code"], cwd=root, check=True)
    for bug in bugs:
        path = root / bug.file
        text = path.read_text()
        assert text.count(bug.old) == 1, f"{bug.file}: {bug.old!r} is not there exactly once"
        path.write_text(text.replace(bug.old, bug.new))
    return root
