"""The README's claims that can drift: its rule table and its two set-up commands."""

import re
from pathlib import Path

from dtype_doctor.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_rule_table_is_the_catalogue() -> None:
    rows = re.findall(r"^\| (DD\d{3}) \| ([a-z0-9-]+) \| (error|warning|info) \|$", README, re.M)
    assert rows == [(r.code, r.name, r.severity) for r in all_rules()]


def test_setup_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo: ", makefile, re.M) and re.search(r"^test: ", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()
