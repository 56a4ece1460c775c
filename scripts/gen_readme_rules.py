"""Write the README's rule table from the rule catalogue, as the rule pages are written from it.

The table lies between two markers in README.md; everything else is kept byte for byte.
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


def with_table(text: str) -> str:
    """`text` (the README) with the catalogue's table between the markers."""
    from dtype_doctor.report import rules_markdown
    from dtype_doctor.rules import all_rules

    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found or not found_end:
        raise SystemExit(f"README.md has no rule table markers ({BEGIN.strip()} … {END.strip()})")
    return head + BEGIN + rules_markdown(all_rules()) + END + tail


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
