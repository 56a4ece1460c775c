"""`dtype-doctor --help`: wall time, and proof that torch is never imported for it.

    1. wall time of the installed `dtype-doctor --help` as a whole process (median of --runs,
       after warm-up); target ≤ 0.3 s. `python -c pass` is timed alongside, interleaved, to
       show how much of that is the bare interpreter.
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
    bare_cmd = [PY, "-c", "pass"]
    header(
        "bench_help: `dtype-doctor --help` wall time and what it imports",
        [f"A  {' '.join(help_cmd)}", f"B  {' '.join(bare_cmd)}   (the interpreter alone, for scale)",
         f"order  {args.warmup} warm-up pair(s), then {args.runs} pairs A B A B ..."],
    )
    for _ in range(args.warmup):
        run_timed(help_cmd, env=env)
        run_timed(bare_cmd, env=env)
    a, b = [], []
    for _ in range(args.runs):
        ra = run_timed(help_cmd, env=env)
        rb = run_timed(bare_cmd, env=env)
        a.append(ra.wall)
        b.append(rb.wall)
    if "Usage" not in ra.stdout:
        sys.exit("bench_help: `dtype-doctor --help` printed no usage text")
    s = spread(a)
    print(f"  dtype-doctor --help  {fmt_spread(s, ' s')}")
    print(f"  python -c pass       {fmt_spread(spread(b), ' s')}")
    print(f"  --help minus bare interpreter, per pair: {fmt_spread(spread([x - y for x, y in zip(a, b)]), ' s')}")

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
    print(f"  => torch imported by --help: {'no' if torch_free else 'YES'}: {'PASS' if torch_free else 'FAIL'}", flush=True)
    print("BENCH-RESULT " + json.dumps({"name": "--help imports torch", "measured": 0.0 if torch_free else 1.0, "limit": 0.0,
                                        "unit": "bool", "pass": torch_free, "shown": "no" if torch_free else "yes",
                                        "heavy_loaded": mods["loaded"]}), flush=True)
    return 0 if (ok_time and torch_free) else 1


if __name__ == "__main__":
    sys.exit(main())
