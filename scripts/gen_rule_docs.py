"""Write docs/rules.md, the rule catalogue, from the rules themselves.

Each rule's page is what `dtype-doctor rule CODE` prints (the same record, the same sections
in the same order), so the docs are never kept twice. tests/test_docs.py fails when the file
is stale, as tests/test_readme.py does for the README's table.

    python scripts/gen_rule_docs.py           # rewrite docs/rules.md
    python scripts/gen_rule_docs.py --check   # exit 1 when docs/rules.md is stale
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "rules.md"

HEAD = """\
<!-- Written by scripts/gen_rule_docs.py from the rule catalogue (dtype_doctor/rules/): do not edit by hand. -->
# Rules

Every rule has a permanent code; codes are never reused. A rule's severity is its default: a
finding may lower it where the evidence says so (a DD104 that torch silently accepts is a
warning). Nothing PyTorch and the libraries handle correctly is reported: modules kept in fp32
by `_keep_in_fp32_modules`, int64 ids with half weights, 2-D padding masks the model converts
itself, fp32 adapters on a half base, fp32 weights under autocast, half inputs into fp32 norm
layers.

The same text is printed by `dtype-doctor rule CODE` (see [rule and rules](commands/rules.md)).
`--select` and `--ignore` take codes or prefixes (`DD1`, `DD5`).

"""


def _prose(text: str) -> str:
    """Plain text as markdown that renders as written: markup characters escaped."""
    text = text.strip().replace("&", "&amp;").replace("<", "&lt;")
    return re.sub(r"([\\`*_\[\]#|])", r"\\\1", text)


def page() -> str:
    """docs/rules.md as the catalogue has it."""
    from dtype_doctor.report.rule_docs import RULE_SECTIONS
    from dtype_doctor.rules import all_rules

    rules = sorted(all_rules(), key=lambda r: r.code)
    lines = [HEAD.rstrip("\n"), "", "| code | name | default | what it flags |", "|---|---|---|---|"]
    lines += [f"| [{r.code}](#{r.code.lower()}) | {r.name} | {r.severity} | {_prose(r.summary)} |" for r in rules]
    for rule in rules:
        lines += ["", f"## {rule.code} {rule.name} {{#{rule.code.lower()}}}", "", f"Default severity: **{rule.severity}**."]
        for heading, attr in RULE_SECTIONS:
            value = str(getattr(rule, attr, "") or "").strip("\n")
            if not value.strip():
                continue
            lines += ["", f"**{heading}**", ""]
            lines += ["```python", value, "```"] if attr == "example" else [_prose(value)]
        if rule.references:
            lines += ["", "**References**", ""]
            lines += [f"- <{ref}>" if ref.startswith("http") else f"- {_prose(ref)}" for ref in rule.references]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    new = page()
    old = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if "--check" in argv:
        if new != old:
            print("docs/rules.md is stale; run python scripts/gen_rule_docs.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's dtype_doctor, whatever is installed
    sys.exit(main(sys.argv[1:]))
