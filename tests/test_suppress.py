"""Suppressions on recorded reports: a `# dtype-doctor: ignore[...]` comment on the user's line and
a baseline file each hold a finding back, count it, and leave the others; the fingerprint a
baseline keys on survives what changes between runs (lines, values, batch size)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dtype_doctor.records import Report, SourceLoc, Suppressed
from dtype_doctor.report import render
from dtype_doctor.report.suppress import Baseline, comment_codes, suppress
from test_report import DD101, DD104, DD108, full_report


@pytest.mark.parametrize(
    "line, codes",
    [
        ("x = x.half()  # dtype-doctor: ignore[DD101]", ("DD101",)),
        ("x = x.half()  # noqa: E501  dtype-doctor: ignore[dd101, DD2]", ("DD101", "DD2")),
        ("x = x.half()  # dtype-doctor: ignore", ()),
        ("x = x.half()  #dtype-doctor:ignore[DD1]", ("DD1",)),
        ("x = x.half()  # dtype doctor ignore", None),
        ("s = 'dtype-doctor: ignore[DD101]'", None),  # in a string, not a comment
    ],
)
def test_comment_codes(line: str, codes: tuple[str, ...] | None) -> None:
    assert comment_codes(line) == codes


def _prep(tmp_path: Path, comment: str) -> Path:
    prep = tmp_path / "prep.py"
    prep.write_text("\n" * 11 + f"    x = x.half(){comment}\n")
    return prep


@pytest.mark.parametrize("comment, held", [("  # dtype-doctor: ignore[DD101]", True), ("  # dtype-doctor: ignore[DD1]", True),
                                           ("  # dtype-doctor: ignore", True), ("  # dtype-doctor: ignore[DD104]", False),
                                           ("", False)])
def test_a_comment_on_the_users_line_holds_the_finding(tmp_path: Path, comment: str, held: bool) -> None:
    prep = _prep(tmp_path, comment)
    report = full_report(findings=(replace(DD101, source=SourceLoc(str(prep), 12)), DD104))
    out = suppress(report)
    assert [f.code for f in out.findings] == (["DD104"] if held else ["DD101", "DD104"])
    d = json.loads(render(out, "json"))
    if held:
        assert d["suppressed"]["total"] == d["suppressed"]["comment"] == 1 and d["suppressed"]["baseline"] == 0
        assert d["suppressed"]["findings"][0]["code"] == "DD101" and d["suppressed"]["findings"][0]["by"] == "comment"
        assert (d["summary"]["error"], d["summary"]["warning"]) == (0, 1)  # and so the exit code
        assert not out.at_or_above("error")
    else:
        assert "suppressed" not in d


def test_a_baseline_holds_what_it_lists_and_nothing_else(tmp_path: Path) -> None:
    before = full_report(findings=(DD101, DD104))
    path = tmp_path / "dtype-doctor-baseline.json"
    Baseline.of(before).write(path)
    written = json.loads(path.read_text())
    assert {e["code"] for e in written["findings"]} == {"DD101", "DD104"} and written["dtype_doctor_baseline"] == 1
    # Next run: the same two (one moved, its values changed) and a new one.
    moved = replace(DD101, source=SourceLoc("prep.py", 40), message="Conv2d received float32 input (3.1 GiB) but …")
    after = suppress(full_report(findings=(moved, DD104, DD108)), Baseline.read(path))
    assert [f.code for f in after.findings] == ["DD108"]
    assert [(s.finding.code, s.by) for s in after.suppressed] == [("DD101", "baseline"), ("DD104", "baseline")]
    d = json.loads(render(after, "json"))
    assert d["suppressed"]["baseline"] == 2 and d["summary"]["info"] == 1
    # A baseline written again keeps what it held, so accepting a new finding never drops an old one.
    assert Baseline.of(after).fingerprints == {DD101.fingerprint, DD104.fingerprint, DD108.fingerprint}


def test_a_comment_wins_over_the_baseline_and_both_are_counted(tmp_path: Path) -> None:
    prep = _prep(tmp_path, "  # dtype-doctor: ignore[DD101]")
    commented = replace(DD101, source=SourceLoc(str(prep), 12))
    baseline = Baseline(frozenset({commented.fingerprint, DD104.fingerprint}))
    out = suppress(full_report(findings=(commented, DD104)), baseline)
    assert out.findings == () and [s.by for s in out.suppressed] == ["comment", "baseline"]


@pytest.mark.parametrize("text, says", [("{not json", "cannot read it"), ('{"findings": [{"code": "DD101"}]}', "not a dtype-doctor baseline"),
                                        ("[]", "not a dtype-doctor baseline")])
def test_a_bad_baseline_is_bad_input(tmp_path: Path, text: str, says: str) -> None:
    from dtype_doctor.records.errors import InputError

    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(InputError, match=says):
        Baseline.read(path)


def test_every_finding_carries_its_fingerprint_and_what_it_keys_on() -> None:
    d = json.loads(render(full_report(), "json"))
    assert [f["fingerprint"] for f in d["findings"]] == [DD101.fingerprint, DD104.fingerprint, DD108.fingerprint]
    assert len(set(f["fingerprint"] for f in d["findings"])) == 3
    assert replace(DD101, severity="warning", pytorch_error=None).fingerprint == DD101.fingerprint
    assert replace(DD101, op="aten.addmm.default").fingerprint != DD101.fingerprint
    assert replace(DD101, stage="preprocess").fingerprint != DD101.fingerprint


def test_suppressed_findings_leave_every_format_but_are_counted() -> None:
    report = Report(**{**full_report().__dict__, "findings": (DD104,), "suppressed": (Suppressed(DD101, "baseline"),)})
    sarif = json.loads(render(report, "sarif"))["runs"][0]
    assert [r["ruleId"] for r in sarif["results"]] == ["DD104"] and sarif["properties"]["suppressed"] == 1
    assert "DD101" not in render(report, "github")
    assert "1 suppressed" in render(report, "rich")
