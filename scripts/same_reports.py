"""Behaviour unchanged, measured: the JSON reports of a set of CLI scenarios at two checkouts.

    python scripts/same_reports.py collect ROOT OUT_DIR     # run every scenario with ROOT's package
    python scripts/same_reports.py diff OLD_DIR NEW_DIR     # the scenarios whose reports differ

A scenario is one `dtype-doctor ... --format json` command (scan on the fixtures, run on the
tests' seed scripts, --simulate for a CUDA target) run in a fresh process with ROOT first on
PYTHONPATH, from a scratch folder holding a copy of the demo data (datasets.map writes cache files
beside it). Timings and the paths of the checkout and the scratch folder are taken out before the
reports are compared; everything else (findings, lineage, coverage, precision, target) must match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FIX = "{root}/fixtures"
SEEDS = "."  # the seed scripts, copied beside the data: the same path at both checkouts
SCENARIOS: dict[str, list[str]] = {
    "scan-demo": ["scan", f"{FIX}/demo/model", f"{FIX}/demo/data"],
    "scan-demo-simulate-cuda": ["scan", f"{FIX}/demo/model", f"{FIX}/demo/data", "--simulate", "--device", "cuda"],
    # (--train on a model with dropout measures different gradients each run: the demo's ResNet has none)
    "scan-bert-fp16": ["scan", f"{FIX}/models/bert-tiny", f"{FIX}/data/text-cls", "--dtype", "float16"],
    "scan-demo-train-autocast": ["scan", f"{FIX}/demo/model", f"{FIX}/demo/data", "--train", "--autocast", "float16"],
    "scan-llama-autocast-simulate-t4": ["scan", f"{FIX}/models/llama-tiny", f"{FIX}/data/lm-text", "--autocast", "bfloat16",
                                        "--simulate", "--gpu", "t4"],
    "scan-t5": ["scan", f"{FIX}/models/t5-tiny", f"{FIX}/data/t5-pairs"],
    "fix-demo": ["fix", f"{FIX}/demo/model", f"{FIX}/demo/data"],
    "run-seed-map-autocast": ["run", "--", "python", f"{SEEDS}/seed_map_autocast.py", f"{FIX}/models/resnet-tiny", "{tmp}/data"],
    "run-seed-half-audit": ["run", "--", "python", f"{SEEDS}/seed_half_audit.py", f"{FIX}/models/bert-tiny", f"{FIX}/data/text-cls"],
    "run-seed-amp-loop": ["run", "--", "python", f"{SEEDS}/seed_amp_loop.py", "2"],
    "run-seed-amp-loop-simulate-cuda": ["run", "--simulate", "--device", "cuda", "--", "python", f"{SEEDS}/seed_amp_loop.py", "2"],
    "run-seed-half-audit-simulate-a100": ["run", "--simulate", "--gpu", "a100", "--", "python", f"{SEEDS}/seed_half_audit.py",
                                          f"{FIX}/models/bert-tiny", f"{FIX}/data/text-cls"],
    "run-seed-pil-simulate-h100": ["run", "--simulate", "--gpu", "h100", "--", "python", f"{SEEDS}/seed_pil_transforms.py",
                                   f"{FIX}/models/resnet-tiny", f"{FIX}/data/images"],
}
TIMING = re.compile(r"(^|_)(seconds|time|elapsed|duration|wall)(_|$)")
SITE_PACKAGES = re.compile(r'[^"]*/site-packages/')  # the venv the checkout runs with


def collect(root: Path, out: Path, only: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    for name, argv in SCENARIOS.items():
        if only is not None and only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="same-reports-") as tmp:
            shutil.copytree(root / "fixtures/demo/data", Path(tmp) / "data")
            for script in (root / "tests/scripts").glob("*.py"):
                shutil.copy(script, Path(tmp) / script.name)
            words = [w.replace("{root}", str(root)).replace("{tmp}", tmp) for w in argv]
            at = words.index("--") if "--" in words else len(words)
            words = [*words[:at], "--format", "json", *words[at:]]
            done = subprocess.run([sys.executable, "-m", "dtype_doctor", *words], cwd=tmp, env=env,
                                  capture_output=True, text=True, timeout=600)
            text = SITE_PACKAGES.sub("{site-packages}/", done.stdout)
            text = text.replace(str(root), "{root}").replace(os.path.realpath(tmp), "{tmp}").replace(tmp, "{tmp}")
            try:
                report = normalized(json.loads(text))
            except json.JSONDecodeError:
                report = {"no-json": True, "stderr-tail": done.stderr.strip().splitlines()[-1:]}
            (out / f"{name}.json").write_text(json.dumps({"exit": done.returncode, "report": report}, indent=1, sort_keys=True))
            print(f"{name}: exit {done.returncode}", flush=True)


def normalized(value: object) -> object:
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items() if not TIMING.search(k)}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return value


def diff(old: Path, new: Path) -> int:
    names = sorted({p.name for p in old.glob("*.json")} | {p.name for p in new.glob("*.json")})
    differ = [n for n in names if not (old / n).exists() or not (new / n).exists()
              or (old / n).read_text() != (new / n).read_text()]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names) - len(differ)} of {len(names)} scenarios give the same JSON report")
    return 1 if differ else 0


if __name__ == "__main__":
    command, a, b = sys.argv[1:4]
    if command == "collect":  # a fourth word runs only the scenarios whose name holds it
        collect(Path(a).resolve(), Path(b), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        sys.exit(diff(Path(a), Path(b)))
