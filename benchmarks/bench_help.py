"""`dtype-doctor --help`: CPU time against Typer's floor, and proof that torch is never imported for it.

    1. CPU time of each child process, the installed `dtype-doctor --help`, `dtype-doctor scan
       --help` and an early error (`scan --no-such-option`, exit 2), each paired A B A B ... with
       `python -c "import typer, rich.console"`, the floor of any Typer CLI; target: the median
       ratio of `--help` ≤ 1.5× the floor. The wall time of `--help` is shown too (≤ 0.3 s).
    2. `python -X importtime -c "...; run()"` with argv ['dtype-doctor', '--help']: the import
       log must not name torch (transformers and datasets are reported too); a second child
       lists the heavy packages present in sys.modules after --help ran.

    python benchmarks/bench_help.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PY, bench_env, cli_command, fmt_spread, header, run_timed, spread, verdict  # noqa: E402

LIMIT_S = 0.3
RATIO_LIMIT = 1.5  # --help's CPU time over importing typer and rich.console
HEAVY = ("torch", "transformers", "datasets", "numpy", "pyarrow", "libcst", "safetensors", "PIL")

_RUN_HELP = "import sys; sys.argv = ['dtype-doctor', '--help']; from dtype_doctor.cli.main import run; run()"

_MODULES_AFTER_HELP = (
    "import io, json, sys, contextlib\n"
    "sys.argv = ['dtype-doctor', '--help']\n"
    "from dtype_doctor.cli.main import run\n"
    "buf = io.StringIO()\n"
    "with contextlib.redirect_stdout(buf):\n"
    "    try:\n"
    "        run()\n"
    "    except SystemExit as e:\n"
    "        code = e.code\n"
    f"heavy = {HEAVY!r}\n"
    "print(json.dumps({'exit': code, 'help_chars': len(buf.getvalue()), "
    "'loaded': sorted(m for m in sys.modules if m.split('.')[0] in heavy and m.count('.') == 0), "
    "'n_modules': len(sys.modules)}))\n"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15, help="counted runs of each command (default 15)")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)

    env = bench_env()
    help_cmd = [*cli_command(), "--help"]
    floor_cmd = [PY, "-c", "import typer, rich.console"]
    header(
        "bench_help: `dtype-doctor --help` against importing typer and rich.console, and what it imports",
        [f"floor  {' '.join(floor_cmd)}", f"order  {args.warmup} warm-up pair(s), then {args.runs} pairs A B A B ... per command"],
    )
    ratios: dict[str, list[float]] = {}
    walls: list[float] = []
    for label, cmd, ok in (("--help", help_cmd, (0,)), ("scan --help", [*cli_command(), "scan", "--help"], (0,)),
                           ("early error", [*cli_command(), "scan", "--no-such-option"], (2,))):
        for _ in range(args.warmup):
            run_timed(cmd, env=env, ok=ok)
            run_timed(floor_cmd, env=env)
        pairs = [(run_timed(cmd, env=env, ok=ok), run_timed(floor_cmd, env=env)) for _ in range(args.runs)]
        if label == "--help":
            if "Usage" not in pairs[-1][0].stdout:
                sys.exit("bench_help: `dtype-doctor --help` printed no usage text")
            walls = [a.wall for a, _ in pairs]
        ratios[label] = [a.cpu / b.cpu for a, b in pairs]
        cpu_a, cpu_b = spread([a.cpu for a, _ in pairs]), spread([b.cpu for _, b in pairs])
        print(f"  {label:12s} cpu {fmt_spread(cpu_a, ' s')}   floor {fmt_spread(cpu_b, ' s')}   "
              f"ratio {fmt_spread(spread(ratios[label]), 'x')}", flush=True)
    s = spread(walls)
    print(f"  dtype-doctor --help wall {fmt_spread(s, ' s')}")

    # Proof 1: the import log.
    log = run_timed([PY, "-X", "importtime", "-c", _RUN_HELP], env=env).stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in log.splitlines() if line.startswith("import time:") and "|" in line]
    imported = [m for m in imported if m != "imported package"]
    top = {m.strip().split(".")[0] for m in imported}
    torch_lines = [m for m in imported if m.strip().split(".")[0] == "torch"]
    print(f"  python -X importtime ... run() with --help: {len(imported)} modules imported; "
          f"torch {'IMPORTED (' + str(len(torch_lines)) + ' modules)' if torch_lines else 'not imported'}; "
          + ", ".join(f"{h} {'yes' if h in top else 'no'}" for h in HEAVY if h != "torch"))
    # Proof 2: sys.modules after run() returned.
    mods = json.loads(run_timed([PY, "-c", _MODULES_AFTER_HELP], env=env).stdout.strip().splitlines()[-1])
    print(f"  sys.modules after --help (exit {mods['exit']}, {mods['help_chars']} chars of help, {mods['n_modules']} modules): "
          f"heavy packages loaded: {mods['loaded'] or 'none'}")

    torch_free = not torch_lines and "torch" not in mods["loaded"]
    ok_time = verdict("--help wall time", s["median"], LIMIT_S, unit="s", min=s["min"], max=s["max"], n=s["n"])
    r = spread(ratios["--help"])
    ok_ratio = verdict("--help CPU time / import typer, rich.console", r["median"], RATIO_LIMIT, min=r["min"], max=r["max"], n=r["n"])
    print(f"  => torch imported by --help: {'no' if torch_free else 'YES'}: {'PASS' if torch_free else 'FAIL'}", flush=True)
    print("BENCH-RESULT " + json.dumps({"name": "--help imports torch", "measured": 0.0 if torch_free else 1.0, "limit": 0.0,
                                        "unit": "bool", "pass": torch_free, "shown": "no" if torch_free else "yes",
                                        "heavy_loaded": mods["loaded"]}), flush=True)
    return 0 if (ok_time and ok_ratio and torch_free) else 1


if __name__ == "__main__":
    sys.exit(main())
