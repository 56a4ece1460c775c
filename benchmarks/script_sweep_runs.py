"""One run of the script sweep: a fresh working copy of a public script, a bounded subprocess, a verdict.

Every run gets its own temporary folder (parallel-safe): the script's folder copied from the
fetched tree, made a git repository (so a `fix --run` patch applies with `git apply` as a user's
would), optionally with one bug injected. Nothing here writes into the fetched tree or the repo.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from script_sweep_manifest import Injection, Script

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
GPUS = ("t4", "a100", "h100")


@dataclass(frozen=True)
class Context:
    scripts: Path  # the folder of fetched copies (<owner>+<repo>/<path>)
    assets: Path
    keep: Path | None = None  # keep each run's folder under here (debugging)


@dataclass(frozen=True)
class Outcome:
    """What one subprocess did: exit code, wall time, its JSON report (if any), the tail of its output."""

    rc: int
    wall: float
    report: dict | None = None
    tail: str = ""
    timed_out: bool = False

    def findings(self, severity: str) -> list[dict]:
        return [f for f in (self.report or {}).get("findings", []) if f.get("severity") == severity]


@dataclass
class Workspace:
    root: Path
    script: Script
    edits: list[tuple[str, int]] = field(default_factory=list)  # (file, line) of each injected edit

    @property
    def cwd(self) -> Path:
        return self.root / Path(self.script.path).parent


def cli() -> list[str]:
    here = Path(PY).parent / "dtype-doctor"
    return [str(here)] if here.is_file() else [PY, "-m", "dtype_doctor.cli.main"]


def env_for(ctx: Context, ws: Workspace) -> dict[str, str]:
    env = dict(os.environ)
    # Each stand-in sits in its own folder, on the path only for the scripts that need it: a torchvision
    # stand-in seen by transformers would change what transformers imports.
    paths = [*(str(ctx.assets / "stubs" / name / "site-packages") for name in ws.script.stubs),
             *(str(ws.root / p) for p in ws.script.pythonpath)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", HF_HOME=str(ws.root / ".hf-home"), HF_HUB_CACHE=str(ctx.assets / "hub"),
               HF_DATASETS_CACHE=str(ws.root / ".hf-home" / "datasets"), MPLBACKEND="Agg",
               WANDB_MODE="disabled", WANDB_DISABLED="true", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1", DISABLE_MLFLOW_INTEGRATION="TRUE",
               HF_HUB_DISABLE_TELEMETRY="1", TORCH_LOGS="-all", PYTHONWARNINGS="ignore")
    return env


def workspace(ctx: Context, script: Script, injection: Injection | None = None) -> Workspace:
    src = ctx.scripts / script.source_dir / script.folder
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: not extracted (run script_sweep.py --extract)")
    base = ctx.keep if ctx.keep else None
    if base:
        base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"sweep-{script.id}-", dir=base))
    # The copy keeps the repository's layout (root/<folder>/...), so a package beside the script imports as it does
    # in a checkout (trl/scripts/sft.py imports trl from the repository root on PYTHONPATH).
    shutil.copytree(src, root / script.folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    for dest, asset in script.place:
        src_asset, to = Path(asset.replace("{assets}", str(ctx.assets))), root / Path(script.path).parent / dest
        to.parent.mkdir(parents=True, exist_ok=True)
        if src_asset.is_dir():
            shutil.copytree(src_asset, to, dirs_exist_ok=True)
        else:
            shutil.copy(src_asset, to)
    for helper in script.setup:
        subprocess.run([PY, *helper.replace("{assets}", str(ctx.assets)).split()], cwd=root / Path(script.path).parent, env=env_for(ctx, Workspace(root, script)),
                       capture_output=True, timeout=300, check=True)
    shutil.copytree(ctx.assets / "datasets-cache", root / ".hf-home" / "datasets")  # the run's own: map() writes there
    git = ["git", "-c", "user.name=sweep", "-c", "user.email=sweep@localhost"]
    (root / ".gitignore").write_text("__pycache__/\n.hf-home/\n*.patch\nreport*.json\n")
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "as fetched"], cwd=root, check=True)
    ws = Workspace(root, script)
    if injection is not None:
        inject(ws, injection)
    return ws


def inject(ws: Workspace, inj: Injection) -> None:
    path = ws.root / ws.script.folder / inj.file
    text = path.read_text()
    if text.count(inj.old) != 1:
        raise ValueError(f"{ws.script.id}: {inj.family}: {inj.old!r} is in {inj.file} {text.count(inj.old)} times, not once")
    start = text.index(inj.old)
    first = text[:start].count("\n") + 1
    path.write_text(text.replace(inj.old, inj.new))
    lines = range(first, first + max(inj.new.count("\n"), 0) + 1)
    ws.edits.extend((str(Path(ws.script.folder) / inj.file), n) for n in lines)


def fill(args: tuple[str, ...], ctx: Context, ws: Workspace) -> list[str]:
    return [a.replace("{assets}", str(ctx.assets)).replace("{work}", str(ws.root)) for a in args]


def script_argv(ctx: Context, ws: Workspace, mode: str, target: str) -> list[str]:
    s = ws.script
    extra = dict(s.modes)[mode] if mode else s.modes[0][1]
    device = s.gpu_args if target in GPUS else s.cpu_args
    return ["python", s.script, *fill(s.args, ctx, ws), *fill(extra, ctx, ws), *fill(device, ctx, ws)]


def call(argv: list[str], ws: Workspace, ctx: Context, timeout: int, report: Path | None = None) -> Outcome:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ws.cwd, env=env_for(ctx, ws), capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        rc, out, timed_out = proc.returncode, proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = 124, True
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    data = None
    if report is not None and report.is_file():
        try:
            data = json.loads(report.read_text())
        except json.JSONDecodeError:
            data = None
    return Outcome(rc, time.monotonic() - t0, data, _tail(out), timed_out)


def _tail(out: str, n: int = 1500) -> str:
    lines = [ln for ln in out.splitlines() if not re.search(r"_pytree|torchao|Writing model shards|it/s\]", ln)]
    return "\n".join(lines)[-n:]


def doctor_run(ctx: Context, ws: Workspace, mode: str, target: str, *, keep_running: bool = False) -> Outcome:
    report = ws.root / f"report-{target}-{mode or 'default'}.json"
    argv = [*cli(), "run", "-o", f"json:{report}", "-q", "--timeout", str(ws.script.timeout)]
    if target in GPUS:
        argv += ["--simulate", "--gpu", target]
    if keep_running:
        argv.append("--keep-running")
    argv += ["--", *script_argv(ctx, ws, mode, target)]
    return call(argv, ws, ctx, ws.script.timeout + 60, report)


def plain_run(ctx: Context, ws: Workspace, mode: str) -> Outcome:
    argv = script_argv(ctx, ws, mode, "cpu")
    return call([PY, *argv[1:]], ws, ctx, ws.script.timeout)


def doctor_fix(ctx: Context, ws: Workspace, mode: str, target: str, fail_on: str = "error") -> tuple[Outcome, str]:
    """`fix --run --write-patch` on the workspace (`--fail-on warning` for a bug the target only warns of, as a
    user who wants it fixed asks); the patch's text ("" when none was written)."""
    patch = ws.root / "fix.patch"
    report = ws.root / "report-fix.json"
    argv = [*cli(), "fix", "--run", "--write-patch", str(patch), "-o", f"json:{report}", "-q",
            "--timeout", str(ws.script.timeout), "--fail-on", fail_on]
    if target in GPUS:
        argv += ["--simulate", "--gpu", target]
    argv += ["--", *script_argv(ctx, ws, mode, target)]
    out = call(argv, ws, ctx, 2 * ws.script.timeout + 120, report)
    return out, patch.read_text() if patch.is_file() else ""


def apply_patch(ws: Workspace, patch: str) -> bool:
    if not patch.strip():
        return False
    path = ws.root / "applied.patch"
    path.write_text(patch)
    proc = subprocess.run(["git", "apply", str(path)], cwd=ws.root, capture_output=True, text=True)
    return proc.returncode == 0


def source_refs(obj: Any) -> list[tuple[str, int]]:
    """Every (file, line) a finding names, wherever in its record."""
    out: list[tuple[str, int]] = []
    if isinstance(obj, dict):
        f, ln = obj.get("file"), obj.get("line")
        if isinstance(f, str) and isinstance(ln, int):
            out.append((f, ln))
        for v in obj.values():
            out.extend(source_refs(v))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(source_refs(v))
    return out


def names_edit(refs: list[tuple[str, int]], ws: Workspace, slack: int = 0) -> bool:
    for f, ln in refs:
        for ef, el in ws.edits:
            if (f == ef or f.endswith("/" + ef) or ef.endswith("/" + f) or Path(f).name == Path(ef).name) \
                    and abs(ln - el) <= slack:
                return True
    return False


def patch_lines(patch: str) -> list[tuple[str, int]]:
    """(file, old line number) of every changed or removed line, and of the line an addition follows."""
    out: list[tuple[str, int]] = []
    file, old = "", 0
    for line in patch.splitlines():
        if line.startswith("--- "):
            file = line[4:].strip().removeprefix("a/")
        elif line.startswith("@@"):
            m = re.match(r"@@ -(\d+)", line)
            old = int(m.group(1)) if m else 0
        elif line.startswith("-") and not line.startswith("---"):
            out.append((file, old))
            old += 1
        elif line.startswith("+") and not line.startswith("+++"):
            out.append((file, max(old - 1, 1)))
            out.append((file, old))
        elif line.startswith(" "):
            old += 1
    return out
