"""Findings a team has accepted, held back from the report and counted, as ruff and mypy do.

Two ways to accept one:

- a comment on the line of your code the finding names (its `source`):

      batch["x"] = batch["x"].double()  # dtype-doctor: ignore[DD105]

  `ignore[DD105,DD101]` takes codes or prefixes (`DD1`); a bare `# dtype-doctor: ignore` takes
  every finding on that line;
- a baseline file: `--write-baseline FILE` writes the findings of a run; `--baseline FILE` holds
  back each later finding whose fingerprint it lists (`Finding.fingerprint`: the rule, module, op,
  stage and tensors, not line numbers or measured values, so edits elsewhere keep it).

A held-back finding leaves `findings` and the summary (and so the exit code) and is listed in
the report's `suppressed` block with what held it. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from dtype_doctor.records.errors import InputError
from dtype_doctor.records import Finding, Report, Suppressed

# `# dtype-doctor: ignore` or `# dtype-doctor: ignore[DD101, DD2]` anywhere in a line's comment.
COMMENT = re.compile(r"#.*?\bdtype-doctor:\s*ignore(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
BASELINE_VERSION = 1


def comment_codes(line: str) -> tuple[str, ...] | None:
    """The codes a line's `# dtype-doctor: ignore[...]` names; () for a bare ignore (all codes);
    None when the line has no such comment."""
    m = COMMENT.search(line)
    if m is None:
        return None
    codes = m.group("codes")
    if codes is None:
        return ()
    return tuple(c.strip().upper() for c in codes.split(",") if c.strip())


@dataclass(frozen=True)
class Baseline:
    """Accepted findings by fingerprint (the file also keeps each one's code, module and message,
    so a reviewer can read what was accepted)."""

    fingerprints: frozenset[str]
    entries: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(cls, report: Report) -> "Baseline":
        """The baseline that accepts this report's findings (and those its baseline held back)."""
        held = [s.finding for s in report.suppressed if s.by == "baseline"]
        findings = [*report.findings, *held]
        entries = tuple({"fingerprint": f.fingerprint, "code": f.code, "module": f.module, "stage": f.stage,
                         "message": f.message} for f in findings)
        return cls(frozenset(e["fingerprint"] for e in entries), entries)

    @classmethod
    def read(cls, path: Path) -> "Baseline":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"--baseline {path}: cannot read it as a baseline ({type(exc).__name__}: {exc})") from None
        entries = data.get("findings") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("fingerprint"), str) for e in entries):
            raise InputError(f"--baseline {path}: not a dtype-doctor baseline (write one with --write-baseline)")
        return cls(frozenset(e["fingerprint"] for e in entries), tuple(entries))

    def write(self, path: Path) -> None:
        from dtype_doctor.records.files import write_atomic

        entries = sorted(self.entries, key=lambda e: (e["code"], e["module"], e["fingerprint"]))
        text = json.dumps({"dtype_doctor_baseline": BASELINE_VERSION, "findings": entries}, indent=2) + "\n"
        write_atomic(Path(path), text, what="the baseline")


def suppress(report: Report, baseline: Baseline | None = None, *, comments: bool = True) -> Report:
    """The report with the findings a source comment or the baseline accepts moved to `suppressed`."""
    lines = _SourceLines()
    kept: list[Finding] = []
    held: list[Suppressed] = list(report.suppressed)
    for f in report.findings:
        by = None
        if comments and f.source is not None and _comment_holds(lines.get(f.source.file, f.source.line), f.code):
            by = "comment"
        elif baseline is not None and f.fingerprint in baseline.fingerprints:
            by = "baseline"
        if by is None:
            kept.append(f)
        else:
            held.append(Suppressed(f, by))
    if len(held) == len(report.suppressed):
        return report
    return dataclasses.replace(report, findings=tuple(kept), suppressed=tuple(held))


def _comment_holds(line: str | None, code: str) -> bool:
    if line is None:
        return False
    codes = comment_codes(line)
    if codes is None:
        return False
    return not codes or any(code.startswith(c) for c in codes)


class _SourceLines:
    """The user's files, each read once, as lines."""

    def __init__(self) -> None:
        self.files: dict[str, list[str] | None] = {}

    def get(self, file: str, line: int) -> str | None:
        if file not in self.files:
            p = Path(file)
            try:
                ok = p.is_file() and p.stat().st_size <= 16 * 2**20
                self.files[file] = p.read_text(encoding="utf-8", errors="replace").splitlines() if ok else None
            except OSError:
                self.files[file] = None
        lines = self.files[file]
        return lines[line - 1] if lines is not None and 1 <= line <= len(lines) else None


def counted(suppressed: Iterable[Suppressed]) -> str:
    """`2 suppressed (1 by comment, 1 by baseline)`."""
    items = list(suppressed)
    by = [f"{sum(s.by == k for s in items)} by {k}" for k in ("comment", "baseline") if any(s.by == k for s in items)]
    return f"{len(items)} suppressed ({', '.join(by)})" if items else ""
