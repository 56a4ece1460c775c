"""The script sweep's manifest, read: `script_sweep_manifest.toml` (data only) as frozen records.

Placeholders in arguments: `{assets}` the asset folder (script_sweep_assets.py), `{work}` the
run's working copy. A script runs from `cwd` (relative to its extracted copy), as `python PATH ARGS`
plus its mode's arguments, plus `gpu_args` where the run targets a (simulated) GPU.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).resolve().with_name("script_sweep_manifest.toml")


@dataclass(frozen=True)
class Injection:
    """One bug of `family`, injected as a text edit: `old` (there exactly once) becomes `new` in `file`."""

    family: str
    file: str  # relative to the script's folder
    old: str
    new: str
    mode: str = ""  # the precision mode it is run in ("" = the script's first)
    target: str = "cpu"  # cpu | t4 | a100 | h100: where the bug shows (a GPU-only bug is simulated)
    expect: str = "error"  # the least severity a finding of it must have (bf16 on a T4 runs, slowly: warning)
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.family}@{self.target}"


@dataclass(frozen=True)
class Script:
    id: str
    repo: str  # owner/name
    commit: str
    path: str  # the script, relative to the repository root
    folder: str  # the repository folder copied as the script's folder (relative to the repo root)
    kind: str
    style: str
    args: tuple[str, ...]
    modes: tuple[tuple[str, tuple[str, ...]], ...]  # (mode name, its extra arguments)
    gpu_args: tuple[str, ...] = ()
    cpu_args: tuple[str, ...] = ()
    stubs: tuple[str, ...] = ()  # stand-in packages (script_sweep_stubs/) it needs: torchvision, evaluate, ...
    pythonpath: tuple[str, ...] = ()  # folders of the repo copy put on PYTHONPATH (minGPT's package)
    gpu: bool = True  # False: the script has no GPU path at all (no simulated targets)
    cpu: bool = True  # False: no CPU path (its device from torch.accelerator, no flag to say cpu): no plain or CPU rows
    gpu_modes: tuple[str, ...] = ()  # modes only a GPU offers (fp16 AMP): not run on the CPU
    injections: tuple[Injection, ...] = ()
    place: tuple[tuple[str, str], ...] = ()  # (path in the copy, asset path) copied in before a run
    setup: tuple[str, ...] = ()  # the repo's own helper run first (`python generate_sine_wave.py`)
    timeout: int = 240
    note: str = ""

    @property
    def source_dir(self) -> str:
        return self.repo.replace("/", "+")

    @property
    def script(self) -> str:
        return Path(self.path).name


def load(path: Path = MANIFEST) -> tuple[Script, ...]:
    data = tomllib.loads(path.read_text())
    repos = data.get("repos", {})
    out = []
    for raw in data["script"]:
        injections = tuple(Injection(**i) for i in raw.pop("inject", ()))
        modes = tuple((k, tuple(v)) for k, v in raw.pop("modes", {"fp32": []}).items())
        place = tuple(raw.pop("place", {}).items())
        raw.setdefault("commit", repos.get(raw["repo"], ""))
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
        out.append(Script(**fields, modes=modes, injections=injections, place=place))
    ids = [s.id for s in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"manifest: duplicate ids {sorted(dup)}")
    return tuple(out)
