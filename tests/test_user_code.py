"""The user's code under the doctor's control: its exits are named, its prints go to stderr, a
real Ctrl-C is exit 130 with one line, and --timeout stops a function or script that never
returns and says where it was. Real files, real processes where a signal is involved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_bad_input import DEMO_DATA, DEMO_MODEL, assert_one_error_line, run_cli, tree_hash

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
PREP = '''\
import sys
import time

print("importing prep")


def exits_zero(row):
    sys.exit(0)


def says_bye(row):
    raise SystemExit("bye")


def prints(row):
    print("hello from the user's function")
    return row


def loops(row):
    n = 0
    while True:
        n += 1


def swallows(row):
    while True:
        try:
            time.sleep(0.05)
        except Exception:
            pass


def slow(row):
    print("slow started", file=sys.stderr, flush=True)
    time.sleep(120)
    return row
'''


@pytest.fixture
def prep(tmp_path: Path) -> Path:
    f = tmp_path / "prep.py"
    f.write_text(PREP)
    return f


def scan(prep: Path, func: str, *more: str) -> list[str]:
    return ["scan", str(DEMO_MODEL), str(DEMO_DATA), "--preprocess", f"{prep}:{func}", *more]


def without_prints(err: str) -> str:
    """stderr less the user's own prints (the module's and the script's)."""
    return "\n".join(ln for ln in err.splitlines() if ln not in ("importing prep", "starting"))


def line_of(prep: Path, text: str) -> int:
    return next(i for i, line in enumerate(prep.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("mode", ["map", "transform"])
@pytest.mark.parametrize(("func", "words"), [("exits_zero", "sys.exit(0)"), ("says_bye", "sys.exit('bye')")])
def test_sys_exit_in_a_preprocess_function_is_bad_input_naming_it(prep: Path, func: str, words: str, mode: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_hash(prep.parent)
    code, out, err = run_cli(capsys, scan(prep, func, "--preprocess-mode", mode))
    assert code == 2
    stop = "sys.exit(0)" if func == "exits_zero" else 'SystemExit("bye")'
    assert_one_error_line(without_prints(err), f"{prep}:{func}", words, f"prep.py:{line_of(prep, stop)}")
    assert out == "" and tree_hash(prep.parent) == before


def test_prints_in_the_user_function_go_to_stderr_and_json_parses(prep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, scan(prep, "prints", "--format", "json"))
    assert code == 1  # the demo's DD101
    assert json.loads(out)["schema_version"] == 1
    assert "hello from the user's function" in err and "importing prep" in err


@pytest.mark.parametrize("func", ["loops", "swallows"])
def test_timeout_stops_a_function_that_never_returns_and_says_where(prep: Path, func: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, scan(prep, func, "--timeout", "1"))
    assert code == 2
    line = assert_one_error_line(without_prints(err), f"{prep}:{func}", "--timeout 1 s", "prep.py:")
    where = int(line.split("prep.py:")[-1].split()[0])
    body = range(line_of(prep, f"def {func}"), line_of(prep, f"def {func}") + 7)
    assert where in body, line  # a line of the looping function itself
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)  # the handler is given back


def test_timeout_stops_a_script_before_its_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('starting')\nwhile True:\n    time.sleep(0.05)\n")
    code, out, err = run_cli(capsys, ["run", "--timeout", "1", "--format", "json", "--", "python", str(script)])
    assert code == 2 and out == ""
    assert_one_error_line(without_prints(err), "--timeout 1 s", "hang.py:4")


def test_bad_timeout_is_a_usage_error(prep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, scan(prep, "prints", "--timeout", "-1"))
    assert code == 2
    assert_one_error_line(err, "--timeout")


def _terminal_sigint() -> None:
    """The child starts with Ctrl-C as a terminal gives it: SIGINT at its default and unblocked. A
    process inherits an ignored or blocked SIGINT from its parent, and the test runner's worker can
    carry one (seen in the full suite under xdist), which would make Python skip its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("mode", ["map", "transform"])
def test_a_real_sigint_during_a_slow_user_function_is_130_and_one_line(prep: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        # --timeout 600: this is about Ctrl-C; --preprocess's 60 s default must not end it first on a loaded machine
        [sys.executable, "-m", "dtype_doctor", *scan(prep, "slow", "--preprocess-mode", mode, "--format", "json", "--timeout", "600")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=prep.parent,
        preexec_fn=_terminal_sigint,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "slow started" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (seen, rest)
    assert out == ""
    line = assert_one_error_line(rest, f"interrupted in preprocess function {prep}:slow at prep.py:")
    # the signal lands in the function's print or its sleep, as the process happens to be
    assert int(line.rsplit(":", 1)[1]) in (line_of(prep, "slow started"), line_of(prep, "time.sleep(120)")), line
