"""The user's guide: docs/ builds with `mkdocs build --strict` (no broken link or anchor, every page
in the nav), its rule catalogue is the rules' own text, and the README, benchmarks/README.md and
CHANGELOG.md link only to files that exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def test_the_docs_build_strictly() -> None:
    """mkdocs --strict fails on a link to a missing page or anchor and on a page left out of the nav."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    # Built outside pytest's temporary directories: conftest scans those for reports at the end.
    with tempfile.TemporaryDirectory() as site:
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", site],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "WARNING" not in done.stderr, done.stderr[-3000:]
        assert (Path(site) / "rules" / "index.html").is_file()


def _rule_docs():  # noqa: ANN202 - the module scripts/gen_rule_docs.py
    spec = importlib.util.spec_from_file_location("gen_rule_docs", ROOT / "scripts" / "gen_rule_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rules_page_is_the_catalogue() -> None:
    from dtype_doctor.rules import all_rules

    page = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert _rule_docs().page() == page, "stale docs/rules.md: run python scripts/gen_rule_docs.py"
    assert re.findall(r"^## (DD\d{3}) ", page, re.M) == [r.code for r in all_rules()]


def test_the_rules_page_generator_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _rule_docs()
    stale = tmp_path / "rules.md"
    stale.write_text("# Rules\n", encoding="utf-8")
    monkeypatch.setattr(gen, "PAGE", stale)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text(encoding="utf-8") == (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("name", ["README.md", "benchmarks/README.md", "CHANGELOG.md"])
def test_the_repository_pages_link_to_files_that_exist(name: str) -> None:
    path = ROOT / name
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        if not file:
            assert anchor in anchors, f"{name}: no heading for #{anchor}"
        else:
            assert (path.parent / file).exists(), f"{name} links to {file}, which does not exist"


def test_the_readme_is_a_guide_with_a_table_of_contents() -> None:
    assert len(README.splitlines()) <= 400
    assert "## Contents" in README and "## Exit codes" in README
    assert README.count("## In CI") == 1
    assert len(re.findall(r"^\| [0-3] \| ", README, re.M)) == 4  # exit codes 0-3, in one table


def test_the_ci_page_shows_the_files_init_writes_as_the_readme_does() -> None:
    """docs/ci.md repeats the README's workflow and pre-commit config; test_cli_init checks the README's against init."""
    yaml = lambda text: re.findall(r"^```yaml\n(.*?)^```", text, re.M | re.S)  # noqa: E731
    ci = yaml((ROOT / "docs" / "ci.md").read_text(encoding="utf-8"))
    for block in yaml(README):
        assert block in ci


def test_make_docs_builds_strictly_and_ci_installs_mkdocs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert any(d.startswith("mkdocs-material") for d in extras["docs"])
    assert any(d.startswith("mkdocs-material") for d in extras["test"])  # make test (CI) installs .[test]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^docs: .*\n\t.*mkdocs build --strict", makefile, re.M)
