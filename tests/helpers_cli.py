"""The CLI run in-process as a test sees it: the exit code, the JSON report on stdout (None when
nothing was printed there), and stderr."""

from __future__ import annotations

import json

import pytest

from dtype_doctor.cli.main import run


def run_json(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, dict | None, str]:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    captured = capsys.readouterr()
    return exit_info.value.code, (json.loads(captured.out) if captured.out.strip() else None), captured.err
