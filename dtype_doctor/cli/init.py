"""`dtype-doctor init`: the CI glue for the project in the working directory.

Writes three things, asking nothing it can find itself:
  - a `[tool.dtype-doctor]` table appended to pyproject.toml (the rest of the file kept byte
    for byte; a table already there is left alone);
  - `.pre-commit-config.yaml` with a hook that runs the installed dtype-doctor;
  - `.github/workflows/dtype-doctor.yml`: the action on a CPU-only runner, simulating a GPU,
    with the SARIF uploaded to code scanning.
The pipeline (MODEL DATASET for scan, else a training script for run) is found in the project
unless given; what cannot be found is a commented placeholder, said on stderr. A file that
exists is never overwritten without --force; each file is written whole or not at all.
Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from dtype_doctor import __version__
from dtype_doctor.records.errors import UsageError
from dtype_doctor.records.files import write_atomic

PRE_COMMIT = Path(".pre-commit-config.yaml")
WORKFLOW = Path(".github/workflows/dtype-doctor.yml")
PYPROJECT = Path("pyproject.toml")
PLACEHOLDER_MODEL, PLACEHOLDER_DATA = "path/to/model", "path/to/dataset"
_SKIP = {".git", ".venv", "venv", "env", "node_modules", "__pycache__", "site-packages", "build", "dist"}
_DATA_FILES = (".parquet", ".jsonl", ".arrow", ".csv")

ModelOpt = Annotated[Optional[str], typer.Option("--model", metavar="MODEL", help="The model scan traces (default: a directory of the project with a model's config.json).")]
DatasetOpt = Annotated[Optional[str], typer.Option("--dataset", metavar="DATASET", help="The dataset scan reads (default: the project's save_to_disk directory or data file nearest the model).")]
ScriptOpt = Annotated[Optional[str], typer.Option("--script", metavar="FILE.py", help="Check `dtype-doctor run -- python FILE.py` instead of scan (default when the project has a train*.py and no model).")]
GpuOpt = Annotated[str, typer.Option("--gpu", metavar="NAME|CC", help="GPU the CI run simulates on its CPU-only runner.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite .pre-commit-config.yaml and the workflow when they exist.")]

EXAMPLES = """
Examples:

\b
  dtype-doctor init

\b
  dtype-doctor init --model fixtures/demo/model --dataset fixtures/demo/data --gpu t4
"""


@dataclass(frozen=True)
class Pipeline:
    """What the hook and the workflow check: `scan MODEL DATASET` or `run -- python SCRIPT`."""

    model: str | None
    dataset: str | None
    script: str | None
    placeholder: bool

    def args(self) -> list[str]:
        if self.script is not None:
            return ["run", "--", "python", self.script]
        return ["scan", self.model or PLACEHOLDER_MODEL, self.dataset or PLACEHOLDER_DATA]


def init_command(model: ModelOpt = None, dataset: DatasetOpt = None, script: ScriptOpt = None,
                 gpu: GpuOpt = "a100", force: ForceOpt = False) -> None:
    """Write [tool.dtype-doctor], a pre-commit hook and a GitHub workflow for this project."""
    from dtype_doctor.machine.gpus import check_gpu

    check_gpu(gpu)  # a typo fails here, not on the runner
    root = Path.cwd()
    pipeline = find_pipeline(root, model, dataset, script)
    existing = [p for p in (PRE_COMMIT, WORKFLOW) if (root / p).exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(map(str, existing))} already there; nothing written (--force replaces it)")
    table = pyproject_with_table(root / PYPROJECT)
    if table is not None:
        write_atomic(root / PYPROJECT, table, what=str(PYPROJECT))
        say(f"wrote [tool.dtype-doctor] to {PYPROJECT}")
    else:
        say(f"{PYPROJECT} already has [tool.dtype-doctor]; left as it is")
    write_atomic(root / PRE_COMMIT, pre_commit_config(pipeline), what=str(PRE_COMMIT))
    say(f"wrote {PRE_COMMIT} (run `pre-commit install` to check every commit)")
    action, guessed = action_ref()
    write_atomic(root / WORKFLOW, workflow(pipeline, gpu, action), what=str(WORKFLOW))
    say(f"wrote {WORKFLOW}")
    if pipeline.placeholder:
        say(f"no model and dataset or training script found: edit {PLACEHOLDER_MODEL} and {PLACEHOLDER_DATA} "
            f"in {PRE_COMMIT} and {WORKFLOW} (or re-run with --model and --dataset, --force)")
    if guessed:
        say(f"edit `uses: {action}` in {WORKFLOW}: where your copy of the dtype-doctor action lives")


def say(text: str) -> None:
    print(f"dtype-doctor: {text}", file=sys.stderr)


# ------------------------------------------------------------------ finding the pipeline


def find_pipeline(root: Path, model: str | None, dataset: str | None, script: str | None) -> Pipeline:
    if script is not None:
        return Pipeline(None, None, script, placeholder=False)
    model = model or _nearest(root, _is_model_dir, None)
    dataset = dataset or _nearest(root, _is_dataset, model)
    if model and dataset:
        return Pipeline(model, dataset, None, placeholder=False)
    found = _train_script(root)
    if found is not None:
        return Pipeline(None, None, found, placeholder=False)
    return Pipeline(model, dataset, None, placeholder=True)


def _walk(root: Path, depth: int = 4):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith(".") and len(rel.parts) < depth)
        yield rel, set(filenames)


def _is_model_dir(path: Path, files: set[str]) -> bool:
    if "config.json" not in files:
        return False
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def _is_dataset(path: Path, files: set[str]) -> bool:
    return {"dataset_info.json", "state.json"} <= files or "dataset_dict.json" in files


def _nearest(root: Path, test, near: str | None) -> str | None:
    """The match sharing the longest leading path with `near`, then the shallowest, then by name."""
    matches = [rel for rel, files in _walk(root) if test(root / rel, files)]
    if not matches and test is _is_dataset:
        matches = [rel / f for rel, files in _walk(root) for f in sorted(files) if f.endswith(_DATA_FILES)]
    if not matches:
        return None
    anchor = Path(near).parts if near else ()

    def shared(p: Path) -> int:
        return next((i for i, (a, b) in enumerate(zip(p.parts, anchor)) if a != b), min(len(p.parts), len(anchor)))

    best = min(matches, key=lambda p: (-shared(p), len(p.parts), p.as_posix()))
    return best.as_posix() or "."


def _train_script(root: Path) -> str | None:
    for folder in (root, root / "scripts", root / "src"):
        found = sorted(p for p in folder.glob("train*.py") if p.is_file())
        if found:
            return found[0].relative_to(root).as_posix()
    return None


# ------------------------------------------------------------------ the three files


def pyproject_with_table(path: Path) -> bytes | None:
    """pyproject.toml's bytes with the table appended, or None when the table is there."""
    import tomllib

    old = path.read_bytes() if path.exists() else b""
    try:
        data = tomllib.loads(old.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path.name} is not valid TOML ({exc}); nothing written") from None
    if "dtype-doctor" in data.get("tool", {}):
        return None
    table = (
        "[tool.dtype-doctor]\n"
        "# Options for every dtype-doctor command run here; the command line wins.\n"
        'fail-on = "error"\n'
        '# ignore = ["DD108"]\n'
    ).encode()
    sep = b"" if not old else (b"\n" if old.endswith(b"\n") else b"\n\n")
    return old + sep + table


def pre_commit_config(pipeline: Pipeline) -> str:
    args = ", ".join(json.dumps(a) for a in pipeline.args())
    return (
        "# dtype-doctor checks the pipeline when Python, JSON or TOML files change.\n"
        "# The hook runs the dtype-doctor installed here (language: system); options come from\n"
        "# [tool.dtype-doctor] in pyproject.toml.\n"
        "repos:\n"
        "  - repo: local\n"
        "    hooks:\n"
        "      - id: dtype-doctor\n"
        "        name: dtype-doctor\n"
        "        entry: dtype-doctor\n"
        "        language: system\n"
        "        pass_filenames: false\n"
        "        types_or: [python, json, toml]\n"
        f"        args: [{args}]\n"
    )


def action_ref() -> tuple[str, bool]:
    """The action's `uses:` where pip recorded a GitHub install of dtype-doctor; else a guess."""
    import importlib.metadata
    import re

    try:
        text = importlib.metadata.distribution("dtype-doctor").read_text("direct_url.json") or "{}"
        url = json.loads(text)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        url = {}
    match = re.match(r"(?:git\+)?https://github\.com/([^/]+/[^/@]+?)(?:\.git)?$", url.get("url", ""))
    vcs = url.get("vcs_info", {})
    rev = vcs.get("requested_revision") or vcs.get("commit_id")
    if match and rev:
        return f"{match.group(1)}@{rev}", False
    return f"OWNER/dtype-doctor@v{__version__}", True


def workflow(pipeline: Pipeline, gpu: str, action: str) -> str:
    if pipeline.script is not None:
        inputs = f"          command: run\n          script: python {pipeline.script}\n"
    else:
        inputs = (f"          command: scan\n          model: {pipeline.model or PLACEHOLDER_MODEL}\n"
                  f"          dataset: {pipeline.dataset or PLACEHOLDER_DATA}\n")
    return (
        "name: dtype-doctor\n"
        "on:\n"
        "  push:\n"
        "  pull_request:\n"
        "permissions:\n"
        "  contents: read\n"
        "jobs:\n"
        "  dtype-doctor:\n"
        "    runs-on: ubuntu-latest  # CPU only: the GPU is simulated\n"
        "    permissions:\n"
        "      contents: read\n"
        "      security-events: write  # upload-sarif\n"
        "    steps:\n"
        "      - uses: actions/checkout@v4\n"
        "      - uses: actions/setup-python@v5\n"
        "        with:\n"
        '          python-version: "3.12"\n'
        "      - id: doctor\n"
        f"        uses: {action}\n"
        "        with:\n"
        f"{inputs}"
        '          simulate: "true"\n'
        f"          gpu: {gpu}\n"
        "          sarif: dtype-doctor.sarif\n"
        "      - if: ${{ !cancelled() && hashFiles('dtype-doctor.sarif') != '' }}\n"
        "        uses: github/codeql-action/upload-sarif@v4\n"
        "        with:\n"
        "          sarif_file: dtype-doctor.sarif\n"
        "          category: dtype-doctor\n"
    )
