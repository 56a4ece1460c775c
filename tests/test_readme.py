"""The README's claims that can drift: its rule table and its two set-up commands."""

import re
from pathlib import Path

from dtype_doctor.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _generator():  # noqa: ANN202 - the module scripts/gen_readme_rules.py
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_readme_rules", ROOT / "scripts" / "gen_readme_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rule_table_is_the_catalogue() -> None:
    """The README's table is what scripts/gen_readme_rules.py writes from the catalogue: stale, this fails."""
    assert _generator().with_table(README) == README, "stale rule table: run python scripts/gen_readme_rules.py"
    table = README.split("<!-- rule table")[1].split("<!-- end of rule table")[0]
    cells = re.findall(r"(DD\d{3}) \| ([a-z0-9-]+) \| (error|warning|info) \|", table)
    assert sorted(cells) == [(r.code, r.name, r.severity) for r in all_rules()]


def test_the_rule_table_generator_writes_a_new_rule_and_checks(tmp_path: Path) -> None:
    """A rule the README lacks (its row struck out here) is written back; --check fails before, passes after."""
    gen = _generator()
    stale = tmp_path / "README.md"
    last = all_rules()[-1]
    row = next(line for line in README.splitlines(keepends=True) if f" {last.code} | {last.name} | {last.severity} |" in line)
    stale.write_text(README.replace(row, ""), encoding="utf-8")
    assert stale.read_text(encoding="utf-8") != README
    assert gen.main(["--check", "--readme", str(stale)]) == 1
    assert gen.main(["--readme", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == README
    assert gen.main(["--check", "--readme", str(stale)]) == 0


def _install_lines() -> list[str]:
    return [line.strip() for line in re.findall(r"pip install ([^`\n|]+)", README)]


def test_the_install_lines_install_this_clone_and_its_extras() -> None:
    """No release exists, so every install line takes the package from the clone (`.`, `'.[extra]'`,
    or the wheel built from it), and the extras named are the ones pyproject.toml defines."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wheel = f"dist/{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"
    lines = _install_lines()
    assert {"torch --index-url https://download.pytorch.org/whl/cpu", ".", wheel} <= set(lines)
    for line in lines:
        if line == project["name"]:  # named once, to say that no release exists yet
            assert "has made no release yet" in README
            continue
        if line.startswith("torch") or line in (".", wheel):
            continue
        extras = re.fullmatch(r"'\.\[([a-z,]+)\]'", line)
        assert extras, line
        assert set(extras.group(1).split(",")) <= set(project["optional-dependencies"]), line


def test_setup_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


# ------------------------------------------------------------------ the README, run as written
#
# Every shell command the README shows runs here, as written, in a copy of the repository
# (what a fresh clone holds), one bash session top to bottom as a user pastes them: ```sh
# blocks, ```python blocks, and inline `dtype-doctor …` / `make …` spans. The one exception is
# `make test`, the command that runs this test.

import os
import shutil
import subprocess
import sys

import pytest

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SKIP = {"make test"}


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(README) if kind == lang]


def _commands(script: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _inline(prefix: str) -> list[str]:
    prose = BLOCK.sub("", README)
    spans = re.findall(r"`([^`\n]+)`", prose)
    # A synopsis (MODEL, CODE, [options], a|b) is not a command, nor is a command's bare name
    # in a sentence (`dtype-doctor fix` applies ...): a command has an argument.
    return sorted(
        {s for s in spans if s.startswith(prefix) and len(s.split()) > 2 and not re.search(r"\b[A-Z]{2,}\b|\[|\||…|\.\.\.", s)}
    )


def test_every_code_block_says_what_it_is() -> None:
    assert [kind for kind, _ in BLOCK.findall(README) if not kind] == []
    assert not re.search(r"^    (dtype-doctor|make|python|pip) ", README, re.M), "an indented command block"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files a fresh clone has, with their times, and this checkout's installed .venv."""
    venv = ROOT / ".venv"
    # Under CI (`make test` installs first) a missing or stale .venv is a broken set-up, not a reason to skip.
    stop = pytest.fail if os.environ.get("CI") else pytest.skip
    if not (venv / ".installed").exists():
        stop("run `make install` first: the README's commands use .venv")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    dest = tmp_path_factory.mktemp("clone")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(venv)
    prerequisites = [dest / "pyproject.toml", dest / "scripts" / "install-torch"]
    if any(p.stat().st_mtime > (venv / ".installed").stat().st_mtime for p in prerequisites):
        stop(".venv is older than pyproject.toml: run `make install`")
    return dest


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="100")
    return env


def test_the_shell_commands_run_as_written(clone: Path) -> None:
    commands = [c for block in _blocks("sh") for c in _commands(block)]
    assert "make demo" in commands and "make test" in commands
    lines = ["set -u"]
    for i, c in enumerate(commands):
        if c not in SKIP:
            lines.append(f"{c}; echo \"::done {i} $?\"")
    done = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=clone, env=_env(), capture_output=True, text=True, timeout=900)
    codes = dict(re.findall(r"^::done (\d+) (\d+)$", done.stdout, re.M))
    for i, c in enumerate(commands):
        if c in SKIP:
            continue
        assert str(i) in codes, f"{c!r} did not run:\n{done.stderr[-3000:]}"
        # 1 is a report with findings (the demo has one); 2 and 3 would be a broken command.
        assert codes[str(i)] in ("0", "1"), f"{c!r} exited {codes[str(i)]}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    assert (clone / "fix.patch").exists() and (clone / "dtype-doctor.sarif").exists()


def test_the_python_examples_run_as_written(clone: Path) -> None:
    blocks = _blocks("python")
    assert blocks
    for code in blocks:
        done = subprocess.run([str(clone / ".venv/bin/python"), "-c", code], cwd=clone, env=_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        if "watch(model)" in code:
            assert "DD101" in done.stdout  # the watch() example reached w.report


def test_the_inline_commands_run_as_written(clone: Path) -> None:
    commands = _inline("dtype-doctor ")
    assert "dtype-doctor rule DD104" in commands
    for c in commands:
        done = subprocess.run(["bash", "-c", f". .venv/bin/activate && {c}"], cwd=clone, env=_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode in (0, 1), (c, done.stderr[-2000:])
    for c in {s for s in re.findall(r"`(make [a-z]+)`", BLOCK.sub("", README))}:
        target = c.split()[1]
        done = subprocess.run(["make", "-n", target], cwd=clone, env=_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (c, done.stderr)


def test_the_install_lines_install_in_a_fresh_virtual_environment(clone: Path, tmp_path: Path) -> None:
    """The README's install lines, run in a new virtual environment: `pip install .` from the clone,
    then the wheel `pip wheel` builds. torch and the other requirements are this checkout's .venv
    (made visible by a .pth file; pip and setuptools too, so that the venv's own older bundled
    setuptools does not build), so nothing is downloaded: `--no-index` fails the install where a
    requirement were missing, and `--no-build-isolation` builds with the setuptools already there."""
    import sysconfig

    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "requirements_from_checkout.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    offline = ["--no-index", "--no-build-isolation", "--quiet"]
    lines = _install_lines()
    wheel = next(line for line in lines if line.startswith("dist/"))

    env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}

    def pip(*args: str) -> None:
        done = subprocess.run([str(py), "-m", "pip", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    def installed() -> str:
        done = subprocess.run([str(env_dir / "bin" / "dtype-doctor"), "--version"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return subprocess.run([str(py), "-c", "import dtype_doctor, dtype_doctor.data as d, pathlib; "
                               "print(dtype_doctor.__file__); print((pathlib.Path(d.__file__).parent / 'report.schema.json').is_file())"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout

    assert "." in lines
    pip("install", *offline, ".")
    where, schema = installed().split()
    assert where.startswith(site) and schema == "True"  # the installed copy, with its data files, not the clone
    assert re.search(r"^pip wheel --no-deps --wheel-dir dist \.$", README, re.M)
    pip("wheel", "--no-deps", *offline, "--wheel-dir", "dist", ".")
    assert (clone / wheel).is_file()
    pip("install", *offline, "--force-reinstall", "--no-deps", wheel)
    where, schema = installed().split()
    assert where.startswith(site) and schema == "True"
