"""Write the README's rule table from the rule catalogue, as the rule pages are written from it.

The table lies between two markers in README.md; everything else is kept byte for byte. Two rules
share a row, so the whole catalogue fits a screen of the guide (`dtype-doctor rules --format
markdown` prints the one-rule-a-row table with each rule's summary).
Adding a rule is its module and its test: run this and the README lists it.

    python scripts/gen_readme_rules.py           # rewrite the table
    python scripts/gen_readme_rules.py --check   # exit 1 when the README's table is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = "<!-- rule table: written by scripts/gen_readme_rules.py from the catalogue -->\n"
END = "<!-- end of rule table -->\n"


def table(rules: list) -> str:
    """The catalogue as a markdown table, two rules a row, in code order down the left column first."""
    half = (len(rules) + 1) // 2
    left, right = rules[:half], rules[half:]
    lines = ["| code | name | default | code | name | default |", "|---|---|---|---|---|---|"]
    for i, a in enumerate(left):
        b = right[i] if i < len(right) else None
        cells = f"| {a.code} | {a.name} | {a.severity} |" + (f" {b.code} | {b.name} | {b.severity} |" if b else "  |  |  |")
        lines.append(cells)
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    """`text` (the README) with the catalogue's table between the markers."""
    from dtype_doctor.rules import all_rules

    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise SystemExit(f"README.md has no rule table markers ({BEGIN.strip()} … {END.strip()})")
    return head + BEGIN + table(list(all_rules())) + END + tail


def main(argv: list[str]) -> int:
    path = Path(argv[argv.index("--readme") + 1]) if "--readme" in argv else README
    text = path.read_text(encoding="utf-8")
    new = with_table(text)
    if "--check" in argv:
        if new != text:
            print(f"{path.name}: the rule table is stale; run python scripts/gen_readme_rules.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's dtype_doctor, whatever is installed
    sys.exit(main(sys.argv[1:]))
