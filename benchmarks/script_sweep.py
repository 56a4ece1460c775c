"""The script sweep (issue 38): public training scripts, run as a new user runs them, clean and with one
bug injected at a time.

  clean     each script plainly on the CPU (the assets work: the baseline), then under
            `dtype-doctor run` on the CPU and `run --simulate --gpu {t4,a100,h100}` in every
            precision mode it offers. A clean run passes when the report has no error finding,
            names the machine asked for (device, simulated, GPU) and the script did not fail.
            Warnings are listed for review (a warning the real target would not give is false).
  injected  each manifest `inject` on a fresh copy: found (an error finding naming the edited line),
            fixed at its origin (`fix --run --write-patch` writes a patch that changes the edited
            line, or the line beside it), whole script clean after the patch (the patch applied to
            another copy with `git apply`, then the script run plainly to its end on the CPU; for a
            GPU target `run --simulate --keep-running` to its end, no error finding).

The scripts are not in this repository: `--scripts DIR` is a folder of fetched copies
(`--extract MIRRORS` fills it from `fetch` snapshots, `MIRRORS/<owner>+<repo>/repo` bare git dirs,
at the manifest's pinned commits). Assets are made by script_sweep_assets.py under `--assets`.

Usage:
  python benchmarks/script_sweep.py --extract /work/.mirror --scripts /work/sweep-scripts
  python benchmarks/script_sweep.py --scripts /work/sweep-scripts [--only ID,..|--sample N] \\
      [--part clean,inject] [--targets cpu,t4,a100,h100] [--families F,..] [--jobs 2] \\
      [--json OUT.json] [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import script_sweep_manifest as manifest  # noqa: E402
import script_sweep_runs as runs  # noqa: E402
from script_sweep_assets import make_assets  # noqa: E402
from script_sweep_manifest import Injection, Script  # noqa: E402

TARGETS = ("cpu", *runs.GPUS)
GPU_NAMES = {"t4": "t4", "a100": "a100", "h100": "h100"}


@dataclass(frozen=True)
class CleanRow:
    script: str
    target: str  # plain | cpu | t4 | a100 | h100
    mode: str
    verdict: str  # ok | false-error | wrong-machine | doctor-failed | script-failed | timeout
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    wall: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class InjectRow:
    script: str
    family: str
    target: str
    found: bool
    found_line: bool
    fixed_origin: bool
    clean_after: bool
    codes: tuple[str, ...] = ()
    wall: float = 0.0
    detail: str = ""
    oracle: str = ""  # CPU targets: what the plain mutated script did ("fails" | "runs": not a bug here, not counted)


# ---------------------------------------------------------------- extract


def extract(mirrors: Path, scripts: Path, only: set[str] | None) -> None:
    for s in manifest.load():
        if only and s.id not in only:
            continue
        git_dir = mirrors / s.source_dir / "repo"
        dest = scripts / s.source_dir
        listing = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", s.commit,
                                  "--", s.folder or "."], capture_output=True, text=True, check=True).stdout.split()
        for name in listing:
            out = dest / name
            if out.is_file():
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            blob = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{s.commit}:{name}"],
                                  capture_output=True)
            if blob.returncode == 0:  # a snapshot may lack its largest blobs (data files): the sweep brings its own
                out.write_bytes(blob.stdout)
        print(f"extracted {s.id}: {len(listing)} files from {s.repo}@{s.commit[:10]}")


# ---------------------------------------------------------------- clean


def machine_ok(report: dict, target: str) -> str:
    """'' when the report's target is the machine asked for, else what it says instead."""
    t = report.get("target", {})
    device, simulated, gpu = str(t.get("device") or ""), bool(t.get("simulated")), str(t.get("gpu") or "")
    if target == "cpu":
        return "" if device.startswith("cpu") and not simulated else f"device {device} simulated={simulated}"
    if not device.startswith("cuda") or not simulated:
        return f"device {device or '?'} simulated={simulated} (asked: simulated {target})"
    return "" if gpu.lower().startswith(GPU_NAMES[target]) else f"gpu {gpu or '?'} (asked {target})"


def clean_case(ctx: runs.Context, s: Script, target: str, mode: str) -> CleanRow:
    ws = runs.workspace(ctx, s)
    if target == "plain":
        out = runs.plain_run(ctx, ws, mode)
        verdict = "timeout" if out.timed_out else ("ok" if out.rc == 0 else "script-failed")
        return CleanRow(s.id, target, mode, verdict, wall=out.wall, detail="" if out.rc == 0 else out.tail[-600:])
    out = runs.doctor_run(ctx, ws, mode, target)
    errors = tuple(_label(f) for f in out.findings("error"))
    warnings = tuple(_label(f) for f in out.findings("warning"))
    if out.timed_out:
        verdict, detail = "timeout", out.tail[-400:]
    elif out.report is None:
        verdict, detail = "doctor-failed", out.tail[-600:]
    elif errors:
        verdict, detail = "false-error", "; ".join(_message(f) for f in out.findings("error"))[:600]
    elif machine_ok(out.report, target):
        verdict, detail = "wrong-machine", machine_ok(out.report, target)
    elif out.rc not in (0, 1):
        verdict, detail = "script-failed", out.tail[-600:]
    else:
        verdict, detail = "ok", "; ".join(_message(f) for f in out.findings("warning"))[:400]
    return CleanRow(s.id, target, mode, verdict, errors, warnings, out.wall, detail)


def _label(f: dict) -> str:
    return str(f.get("code") or f.get("rule") or "?")


def _message(f: dict) -> str:
    return f"{_label(f)} {str(f.get('message') or f.get('title') or '')[:200]}"


def clean_cases(s: Script, targets: tuple[str, ...]) -> list[tuple[Script, str, str]]:
    cases = [(s, "plain", s.modes[0][0])] if "cpu" in targets and s.cpu else []
    for target in targets:
        if (target in runs.GPUS and not s.gpu) or (target == "cpu" and not s.cpu):
            continue
        for mode, _ in s.modes:
            if target == "cpu" and mode in s.gpu_modes:
                continue
            cases.append((s, target, mode))
    return cases


# ---------------------------------------------------------------- injected


def inject_case(ctx: runs.Context, s: Script, inj: Injection) -> InjectRow:
    t0 = time.monotonic()
    mode = inj.mode or s.modes[0][0]
    ws = runs.workspace(ctx, s, inj)
    oracle = ""
    if inj.target == "cpu" and inj.expect != "none":  # PyTorch is the oracle: the plain mutated script must fail
        oracle = "fails" if runs.plain_run(ctx, ws, mode).rc != 0 else "runs"
        if oracle == "runs":
            return InjectRow(s.id, inj.family, inj.target, False, False, False, False, (), time.monotonic() - t0,
                             "the mutated script runs plainly on the CPU: not a bug here", oracle)
        ws = runs.workspace(ctx, s, inj)
    out = runs.doctor_run(ctx, ws, mode, inj.target)
    errors = out.findings("error") + (out.findings("warning") if inj.expect == "warning" else [])
    codes = tuple(_label(f) for f in errors)
    if inj.expect == "none":  # a control: the edit is not a bug (the library moves the batch), quiet is right
        quiet = not errors and out.report is not None
        return InjectRow(s.id, inj.family + " (control)", inj.target, quiet, quiet, quiet, quiet, codes,
                         time.monotonic() - t0, "" if quiet else "false finding: " + out.tail[-300:])
    found = bool(errors)
    found_line = any(runs.names_edit(runs.source_refs(_without_lineage(f)), ws) for f in errors)
    fix_ws = runs.workspace(ctx, s, inj)
    fixed, patch = runs.doctor_fix(ctx, fix_ws, mode, inj.target, "warning" if inj.expect == "warning" else "error")
    origin = bool(patch) and runs.names_edit(runs.patch_lines(patch), fix_ws, slack=1)
    after = runs.workspace(ctx, s, inj)
    clean_after, detail = False, ""
    if runs.apply_patch(after, patch):
        if inj.target == "cpu":
            res = runs.plain_run(ctx, after, mode)
            clean_after = res.rc == 0
        else:
            res = runs.doctor_run(ctx, after, mode, inj.target, keep_running=True)
            clean_after = res.report is not None and not res.findings("error") and res.rc == 0
        detail = "" if clean_after else res.tail[-500:]
    else:
        detail = f"no patch (fix rc {fixed.rc}): " + fixed.tail[-400:]
    if not found:
        detail = f"not found (run rc {out.rc}): " + out.tail[-400:] + " | " + detail
    return InjectRow(s.id, inj.family, inj.target, found, found_line, origin, clean_after, codes,
                     time.monotonic() - t0, detail, oracle)


def _without_lineage(f: dict) -> dict:
    """A finding's own location fields; the lineage lists every stage an input passed, not the finding's line."""
    return {k: v for k, v in f.items() if k not in ("lineage",)}


# ---------------------------------------------------------------- figures


def clean_table(rows: list[CleanRow]) -> str:
    lines = ["| target | runs | ok | false errors | wrong machine | doctor failed | script failed/timeout | with warnings |",
             "|---|---|---|---|---|---|---|---|"]
    for target in ("plain", *TARGETS):
        sel = [r for r in rows if r.target == target]
        if not sel:
            continue
        n = lambda v: sum(r.verdict == v for r in sel)  # noqa: E731
        lines.append(f"| {target} | {len(sel)} | {n('ok')} | {n('false-error')} | {n('wrong-machine')} | "
                     f"{n('doctor-failed')} | {n('script-failed') + n('timeout')} | {sum(bool(r.warnings) for r in sel)} |")
    return "\n".join(lines)


def inject_table(rows: list[InjectRow]) -> str:
    lines = ["| family | cases | found | found with the user's line | fixed at origin | whole script clean after patch |",
             "|---|---|---|---|---|---|"]
    skipped = [r for r in rows if r.oracle == "runs"]
    rows = [r for r in rows if r.oracle != "runs"]
    families = sorted({r.family for r in rows})
    for fam in [*families, "all"]:
        sel = [r for r in rows if fam == r.family or (fam == "all" and "(control)" not in r.family)]
        n = len(sel)
        lines.append(f"| {fam} | {n} | {sum(r.found for r in sel)} | {sum(r.found_line for r in sel)} | "
                     f"{sum(r.fixed_origin for r in sel)} | {sum(r.clean_after for r in sel)} |")
    if skipped:
        lines.append("")
        lines.append("Not counted (the mutated script runs plainly on the CPU, so it is no bug there): "
                     + ", ".join(f"{r.script}/{r.family}" for r in skipped))
    return "\n".join(lines)


def scripts_table(scripts: list[Script]) -> str:
    """The manifest as the README lists it: where each script comes from and what it exercises."""
    lines = ["| id | repository @ commit | script | kind | loop | precision modes | injected |", "|---|---|---|---|---|---|---|"]
    for s in scripts:
        lines.append(f"| {s.id} | {s.repo} @ {s.commit[:10]} | `{s.path}` | {s.kind} | {s.style} | "
                     f"{', '.join(m for m, _ in s.modes)} | {', '.join(i.family for i in s.injections) or '—'} |")
    repos = sorted({s.repo for s in scripts})
    return "\n".join(lines) + f"\n\n{len(scripts)} scripts from {len(repos)} repositories."


# ---------------------------------------------------------------- main


def pick(scripts: tuple[Script, ...], only: str | None, sample: int | None, seed: int) -> list[Script]:
    chosen = list(scripts)
    if only:
        wanted = set(only.split(","))
        chosen = [s for s in chosen if s.id in wanted or any(s.id.startswith(w.rstrip("*")) for w in wanted
                                                              if w.endswith("*"))]
    if sample:
        chosen = random.Random(seed).sample(chosen, min(sample, len(chosen)))
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scripts", type=Path, default=Path("/work/sweep-scripts"))
    ap.add_argument("--assets", type=Path, default=Path("/tmp/script-sweep-assets"))
    ap.add_argument("--extract", type=Path, metavar="MIRRORS", help="extract the manifest's files from these mirrors")
    ap.add_argument("--only", help="comma-separated script ids (a trailing * matches a prefix)")
    ap.add_argument("--sample", type=int, help="a random subset of N scripts (--seed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--part", default="clean,inject")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--families", help="only these injected families")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="keep every run's folder under here")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--rows", type=Path, help="append each row, as it is done, to this JSON-lines file")
    ap.add_argument("--tables", type=Path, nargs="+", metavar="ROWS", help="only print the tables of these rows files")
    args = ap.parse_args(argv)
    if args.tables:
        return report(*read_rows(args.tables), args, 0.0)
    scripts = pick(manifest.load(), args.only, args.sample, args.seed)
    if args.list and args.markdown:
        args.markdown.write_text(scripts_table(scripts) + "\n")
        return 0
    if args.list:
        for s in scripts:
            print(f"{s.id:24} {s.repo:24} {s.kind:22} {s.style:14} modes={','.join(m for m, _ in s.modes)} "
                  f"inject={','.join(i.family for i in s.injections)}")
        return 0
    if args.extract:
        extract(args.extract, args.scripts, {s.id for s in scripts})
        return 0
    global ROWS
    ROWS = args.rows
    ctx = runs.Context(args.scripts.resolve(), make_assets(args.assets).resolve(), args.keep)
    t0 = time.monotonic()
    clean, injected = sweep(ctx, scripts, args)
    return report(clean, injected, args, time.monotonic() - t0)


def sweep(ctx: runs.Context, scripts: list[Script], args) -> tuple[list[CleanRow], list[InjectRow]]:
    parts, targets = set(args.part.split(",")), tuple(args.targets.split(","))
    families = set(args.families.split(",")) if args.families else None
    clean_jobs = [c for s in scripts for c in clean_cases(s, targets)] if "clean" in parts else []
    inject_jobs = [(s, i) for s in scripts for i in s.injections
                   if "inject" in parts and (families is None or i.family in families)]
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        clean = list(pool.map(lambda c: _guard_clean(ctx, *c), clean_jobs))
        injected = list(pool.map(lambda c: _guard_inject(ctx, *c), inject_jobs))
    return clean, injected


ROWS: Path | None = None


def _keep(row: CleanRow | InjectRow) -> None:
    if ROWS is not None:
        with open(ROWS, "a") as f:  # one write per line: rows from two workers do not interleave
            f.write(json.dumps({"kind": type(row).__name__, **asdict(row)}) + "\n")


def read_rows(paths: list[Path]) -> tuple[list[CleanRow], list[InjectRow]]:
    """Rows from JSON-lines files (several partial runs); a later row for the same case replaces an earlier one."""
    clean: dict[tuple, CleanRow] = {}
    injected: dict[tuple, InjectRow] = {}
    for path in paths:
        text = path.read_text()
        if path.suffix == ".json":  # a --json file: {"clean": [...], "injected": [...]}
            whole = json.loads(text)
            text = "\n".join(json.dumps({"kind": kind, **row}) for key, kind in (("clean", "CleanRow"),
                              ("injected", "InjectRow")) for row in whole.get(key, []))
        for line in text.splitlines():
            data = json.loads(line)
            kind = data.pop("kind")
            data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
            if kind == "CleanRow":
                clean[(data["script"], data["target"], data["mode"])] = CleanRow(**data)
            else:
                injected[(data["script"], data["family"], data["target"])] = InjectRow(**data)
    return list(clean.values()), list(injected.values())


def _guard_clean(ctx, s, target, mode) -> CleanRow:
    try:
        row = clean_case(ctx, s, target, mode)
    except Exception as e:  # noqa: BLE001 - a sweep row, not a crash of the sweep
        row = CleanRow(s.id, target, mode, "sweep-error", detail=f"{type(e).__name__}: {e}"[:400])
    _keep(row)
    print(f"clean  {row.script:22} {row.target:5} {row.mode:5} {row.verdict:14} {row.wall:5.1f}s "
          f"{' '.join(row.errors + row.warnings)} {row.detail[:300]!r}", flush=True)
    return row


def _guard_inject(ctx, s, inj) -> InjectRow:
    try:
        row = inject_case(ctx, s, inj)
    except Exception as e:  # noqa: BLE001
        row = InjectRow(s.id, inj.family, inj.target, False, False, False, False, detail=f"{type(e).__name__}: {e}"[:400])
    _keep(row)
    print(f"inject {row.script:22} {row.family:18} {row.target:5} found={row.found:d} line={row.found_line:d} "
          f"origin={row.fixed_origin:d} clean={row.clean_after:d} {row.wall:5.1f}s {' '.join(row.codes)} "
          f"{row.detail[:300]!r}", flush=True)
    return row


def report(clean: list[CleanRow], injected: list[InjectRow], args, wall: float) -> int:
    md = []
    if clean:
        md += ["Clean runs (no error finding, the machine asked for):", "", clean_table(clean), ""]
    if injected:
        md += ["Injected bugs:", "", inject_table(injected), ""]
    md.append(f"Wall time {wall / 60:.1f} min, {len(clean)} clean and {len(injected)} injected cases.")
    text = "\n".join(md)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"clean": [asdict(r) for r in clean], "injected": [asdict(r) for r in injected],
                                         "wall_s": wall}, indent=1))
    bad = sum(r.verdict in ("false-error", "wrong-machine", "doctor-failed") for r in clean)
    print(f"BENCH-RESULT {json.dumps({'name': 'script_sweep', 'clean_bad': bad, 'injected': len(injected)})}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
