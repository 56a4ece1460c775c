"""`--format json`: the report docs/report.md describes, schema_version 1, exactly as `Report.to_dict()` builds it."""

from __future__ import annotations

import json

from dtype_doctor.records import Report
from dtype_doctor.report.common import RenderOptions, json_default


def render(report: Report, options: RenderOptions) -> str:
    return json.dumps(report.to_dict(), indent=2, default=json_default) + "\n"
